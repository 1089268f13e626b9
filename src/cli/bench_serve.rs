//! `moestream bench serve`: the server under concurrent clients. It starts
//! the server in this process on a free port, then for each client count
//! sends that many streamed completion requests at once over HTTP (each a
//! distinct prompt, greedy, EOS ignored) and reports aggregate and
//! per-client tok/s, time to first token, MB read per generated token, and
//! how many requests were refused (429).

use super::*;
use moestream::server::{serve_until, ServerConfig};
use moestream_scheduler::SchedulerConfig;
use std::io::BufRead;
use std::time::{Duration, Instant};

#[derive(Args)]
pub(super) struct BenchServeArgs {
    #[command(flatten)]
    pub(super) model: ModelArgs,
    /// Concurrent clients of each round.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    clients: Vec<usize>,
    /// Tokens each request generates.
    #[arg(long, default_value_t = 32)]
    tokens: usize,
    /// Server slots (default: the most clients of any round).
    #[arg(long)]
    slots: Option<usize>,
    /// Server queue (requests beyond slots + queue are answered 429).
    #[arg(long, default_value_t = 0)]
    queue: usize,
    /// Rounds of the whole client list (alternating order on even rounds).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Append one CSV row per measurement.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
}

/// One client's request.
struct Outcome {
    status: u16,
    tokens: usize,
    first_token: Option<Duration>,
    elapsed: Duration,
}

/// One round's figures.
#[derive(serde::Serialize)]
struct Row {
    clients: usize,
    ok: usize,
    refused: usize,
    aggregate_tok_s: f64,
    per_client_tok_s: f64,
    ttft_p50_ms: f64,
    ttft_p99_ms: f64,
    mb_per_token: f64,
    peak_rss_mib: f64,
}

pub(super) fn cmd_bench_serve(a: BenchServeArgs) -> Result<()> {
    use super::limits::{count, CLIENTS_MAX, REPEATS_MAX};
    anyhow::ensure!(!a.clients.is_empty(), "--clients: counts of at least 1");
    for &c in &a.clients {
        count("--clients", c, 1..=CLIENTS_MAX)?;
    }
    anyhow::ensure!(a.tokens >= 1, "--tokens must be at least 1");
    count("--rounds", a.rounds, 1..=REPEATS_MAX)?;
    let slots = a.slots.unwrap_or(*a.clients.iter().max().expect("clients"));
    count("--slots", slots, 1..=CLIENTS_MAX)?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let base = format!("http://{}", listener.local_addr()?);
    let config = ServerConfig {
        model_name: "bench".into(),
        api_key: None,
        host: "127.0.0.1".into(),
        limits: moestream::server::Limits::default(),
        scheduler: SchedulerConfig {
            kv_slots: slots,
            queue_max: a.queue,
            queue_wait_ms_max: 3_600_000,
            batch_max: slots,
        },
        kv_dir: None,
        model_dir: a.model.model.clone(),
        keep_alive: Duration::from_secs(10),
        shutdown_grace: Duration::from_secs(5),
        max_tokens_default: a.tokens,
        overrides: Default::default(),
        speculation: Default::default(),
        reasoning_format: Default::default(),
        cors_origin: None,
    };
    let tok = Tokenizer::load(&a.model.model)?;
    let model_args = a.model.clone();
    let loader = Box::new(move || load(&model_args).map_err(|e| format!("{e:#}")));
    let stop = Box::pin(async move {
        let _ = stop_rx.await;
    });
    let server = std::thread::spawn(move || serve_until(config, listener, tok, None, loader, stop));
    wait_ready(&base)?;
    let result = run_rounds(&a, &base);
    let _ = stop_tx.send(());
    server
        .join()
        .map_err(|_| anyhow::anyhow!("the server thread panicked"))?
        .map_err(anyhow::Error::msg)?;
    result
}

fn wait_ready(base: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(3600);
    while Instant::now() < deadline {
        if ureq::get(&format!("{base}/health")).call().is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("the server did not become ready")
}

fn run_rounds(a: &BenchServeArgs, base: &str) -> Result<()> {
    println!("clients  ok  429  aggregate tok/s  per-client tok/s  TTFT p50 ms  p99 ms  MB/token  peak RSS MiB");
    for round in 0..a.rounds {
        let mut order = a.clients.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        for &clients in &order {
            let row = measure(base, clients, a.tokens, round)?;
            println!(
                "{:>7} {:>3} {:>4} {:>16.2} {:>17.2} {:>12.0} {:>7.0} {:>9.1} {:>13.0}",
                row.clients,
                row.ok,
                row.refused,
                row.aggregate_tok_s,
                row.per_client_tok_s,
                row.ttft_p50_ms,
                row.ttft_p99_ms,
                row.mb_per_token,
                row.peak_rss_mib
            );
            if let Some(path) = &a.csv {
                append_csv(path, &row)?;
            }
        }
    }
    Ok(())
}

/// Appends `row` to the CSV at `path`: the old rows are read (bounded,
/// regular files only) and the whole file replaced through the safe writer.
fn append_csv(path: &Path, row: &Row) -> Result<()> {
    moestream::fs::write::append(path, moestream::fs::read::RESULTS_CSV, |fresh| {
        let mut w = csv::WriterBuilder::new()
            .has_headers(fresh)
            .from_writer(Vec::new());
        w.serialize(row).map_err(|e| e.to_string())?;
        w.into_inner().map_err(|e| e.to_string())
    })?;
    Ok(())
}

/// One round of `clients` concurrent requests.
fn measure(base: &str, clients: usize, tokens: usize, round: usize) -> Result<Row> {
    let before = metric(base, "expert_bytes_read_total")?;
    let generated_before = metric(base, "generated_tokens_total")?;
    let start = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|i| {
            let url = format!("{base}/v1/completions");
            let prompt = format!("Request {round}.{clients}.{i}: the engine reads the expert from the disk while the cores compute");
            std::thread::spawn(move || request(&url, &prompt, tokens))
        })
        .collect();
    let outcomes: Vec<Outcome> = handles
        .into_iter()
        .map(|h| h.join().map_err(|_| anyhow::anyhow!("a client panicked"))?)
        .collect::<Result<_>>()?;
    let wall = start.elapsed().as_secs_f64();
    let bytes = metric(base, "expert_bytes_read_total")? - before;
    let generated = metric(base, "generated_tokens_total")? - generated_before;
    let ok: Vec<&Outcome> = outcomes.iter().filter(|o| o.status == 200).collect();
    let total: usize = ok.iter().map(|o| o.tokens).sum();
    let mut ttft: Vec<f64> = ok
        .iter()
        .filter_map(|o| o.first_token)
        .map(|d| d.as_secs_f64() * 1e3)
        .collect();
    ttft.sort_by(f64::total_cmp);
    let per_client = ok
        .iter()
        .map(|o| o.tokens as f64 / o.elapsed.as_secs_f64().max(1e-9))
        .sum::<f64>()
        / ok.len().max(1) as f64;
    Ok(Row {
        clients,
        ok: ok.len(),
        refused: outcomes.iter().filter(|o| o.status == 429).count(),
        aggregate_tok_s: total as f64 / wall.max(1e-9),
        per_client_tok_s: per_client,
        ttft_p50_ms: percentile(&ttft, 0.5),
        ttft_p99_ms: percentile(&ttft, 0.99),
        mb_per_token: bytes / 1e6 / generated.max(1.0),
        peak_rss_mib: moestream::model::profile::peak_rss_bytes() as f64 / (1 << 20) as f64,
    })
}

/// Nearest-rank percentile of sorted values (0 when empty).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// One streamed request: status, tokens (from the usage chunk), time to
/// the first text, and the whole time.
fn request(url: &str, prompt: &str, tokens: usize) -> Result<Outcome> {
    // logprobs 0 makes every token a chunk of its own (text may be held
    // back, or empty for a synthetic model's tokens), so the first chunk
    // that carries logprobs is the first token.
    let body = serde_json::json!({"prompt": prompt, "max_tokens": tokens, "temperature": 0,
        "ignore_eos": true, "stream": true, "logprobs": 0,
        "stream_options": {"include_usage": true}});
    let start = Instant::now();
    let resp = match ureq::post(url).send_json(body) {
        Ok(r) => r,
        Err(ureq::Error::Status(status, _)) => {
            return Ok(Outcome {
                status,
                tokens: 0,
                first_token: None,
                elapsed: start.elapsed(),
            })
        }
        Err(e) => bail!("{url}: {e}"),
    };
    let (mut first_token, mut n) = (None, 0);
    for line in std::io::BufReader::new(resp.into_reader()).lines() {
        let line = line?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let v: serde_json::Value = serde_json::from_str(data)?;
        if first_token.is_none() && v["choices"][0]["logprobs"].is_object() {
            first_token = Some(start.elapsed());
        }
        if let Some(u) = v["usage"]["completion_tokens"].as_u64() {
            n = u as usize;
        }
    }
    Ok(Outcome {
        status: 200,
        tokens: n,
        first_token,
        elapsed: start.elapsed(),
    })
}

/// A counter of the server's /metrics.
fn metric(base: &str, name: &str) -> Result<f64> {
    let text = ureq::get(&format!("{base}/metrics"))
        .call()?
        .into_string()?;
    let prefix = format!("moestream_{name} ");
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .ok_or_else(|| anyhow::anyhow!("/metrics has no {name}"))?;
    Ok(line.trim().parse()?)
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn nearest_rank() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.5), 2.0);
        assert_eq!(percentile(&v, 0.99), 4.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
        assert_eq!(percentile(&[7.0], 0.01), 7.0);
    }
}
