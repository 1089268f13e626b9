//! The `moestream` command line: `run`, `eval`, `demo`, `synth`.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
