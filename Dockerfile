# moestream in a container: built with nothing but the Rust image (no
# system libraries: the binary links only the C runtime, tests/cli.rs
# checks it), run without network access to anything but its own port.
#
#   docker build -t moestream .       (.dockerignore leaves out target/ and .git)
#   docker run --rm -p 8080:8080 --memory 32g -v /srv/models/M:/model:ro \
#       moestream serve --model /model --host 0.0.0.0
#
# --memory sets the container's memory cgroup: without --ram-gb, moestream
# plans its budget from that limit. io_uring needs a seccomp profile that
# allows io_uring_setup (recent Docker default profiles block it):
# without it the reads fall back to a reader thread, tokens unchanged.

FROM rust:1-slim AS build
WORKDIR /src
# The commit `--version` names (.git is not copied in):
#   docker build --build-arg MOESTREAM_COMMIT=$(git rev-parse --short=12 HEAD) .
ARG MOESTREAM_COMMIT
COPY . .
RUN cargo build --release --locked && strip target/release/moestream

FROM rust:1-slim
RUN useradd --system --create-home --home-dir /var/lib/moestream moestream
COPY --from=build /src/target/release/moestream /usr/local/bin/moestream
USER moestream
ENV MOESTREAM_CACHE=/var/lib/moestream/cache
EXPOSE 8080
ENTRYPOINT ["moestream"]
CMD ["--help"]
