//! The `psmr` binary end to end: results agree across schedulers, JSON lines
//! have the promised fields, and bad input gives one clear error line and a
//! non-zero exit code, never a panic.

use std::process::{Command, Output};

fn psmr(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_psmr")).args(args).output().expect("psmr runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Fails with a clear message on stderr, no panic, no backtrace.
fn fails_with(args: &[&str], needle: &str) {
    let o = psmr(args);
    let err = stderr(&o);
    assert!(!o.status.success(), "{args:?} should fail");
    assert!(err.contains(needle), "{args:?}: stderr should mention {needle:?}, got:\n{err}");
    assert!(!err.contains("panicked"), "{args:?} panicked:\n{err}");
    assert!(!err.contains("RUST_BACKTRACE"), "{args:?} panicked:\n{err}");
    let line = err.lines().find(|l| l.contains(needle)).expect("needle line");
    let parts: Vec<&str> = line.split(": ").filter(|p| p.len() > 10).collect();
    for (i, p) in parts.iter().enumerate() {
        assert!(!parts[i + 1..].contains(p), "{args:?}: the error repeats itself: {line}");
    }
}

#[test]
fn json_lines_have_the_fields_and_digests_agree() {
    let o = psmr(&[
        "sched-bench",
        "--service",
        "list",
        "--model",
        "sharded-global",
        "--shards",
        "2",
        "--workload",
        "25-5-25",
        "--commands",
        "20000",
        "--scheduler",
        "all",
        "--workers",
        "1,2",
        "--json",
        "--seed",
        "7",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is a JSON object"))
        .collect();
    // sequential once, every parallel scheduler at two worker counts.
    assert_eq!(lines.len(), 1 + 2 * (psmr_sched::SchedulerKind::ALL.len() - 1));
    for l in &lines {
        for field in ["scheduler", "workers", "commands", "elapsed_s", "throughput_cps", "digest"] {
            assert!(l.get(field).is_some(), "missing {field} in {l}");
        }
        assert_eq!(l["commands"], 20000);
        assert_eq!(l["digest"], lines[0]["digest"], "digests differ: {l}");
        assert_eq!(l["reply_digest"], lines[0]["reply_digest"]);
    }
    assert_eq!(lines[0]["scheduler"], "sequential");
}

#[test]
fn metrics_lines_cover_every_worker_and_add_up() {
    let o = psmr(&[
        "sched-bench",
        "--service",
        "list",
        "--model",
        "sharded-global",
        "--shards",
        "2",
        "--workload",
        "25-5-25",
        "--scheduler",
        "early,early-busywait,early-ws-queue,early-ws-semi,early-ws-nonblocking,early-ws-optimistic,late-cbase",
        "--workers",
        "3",
        "--commands",
        "20000",
        "--metrics",
        "5",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> =
        String::from_utf8(o.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for kind in
        ["early", "early-busywait", "early-ws-queue", "early-ws-semi", "early-ws-nonblocking", "early-ws-optimistic"]
    {
        let run = lines.iter().find(|l| l["scheduler"] == kind && l.get("type").is_none()).expect("run line");
        let samples: Vec<_> = lines.iter().filter(|l| l["type"] == "metrics" && l["scheduler"] == kind).collect();
        let workers: std::collections::BTreeSet<u64> = samples.iter().map(|s| s["worker"].as_u64().unwrap()).collect();
        assert_eq!(workers.into_iter().collect::<Vec<_>>(), vec![0, 1, 2], "{kind}");
        // Executed commands in the samples add up to each worker's total.
        for w in 0..3u64 {
            let sum: u64 = samples.iter().filter(|s| s["worker"] == w).map(|s| s["executed"].as_u64().unwrap()).sum();
            assert_eq!(sum, run["executed_per_worker"][w as usize].as_u64().unwrap(), "{kind} worker {w}");
        }
        for s in &samples {
            for f in ["sync_idle_s", "queue_idle_s", "queue_size_avg", "t_s", "steals_tried", "steals_ok"] {
                assert!(s[f].as_f64().unwrap() >= 0.0, "{f} in {s}");
            }
        }
    }
    // Schedulers without metrics print none.
    assert!(!lines.iter().any(|l| l["type"] == "metrics" && l["scheduler"] == "late-cbase"));
}

#[test]
fn repeat_reports_the_median_of_its_runs() {
    let o = psmr(&[
        "sched-bench",
        "--scheduler",
        "sequential,early",
        "--workers",
        "2",
        "--commands",
        "3000",
        "--repeat",
        "3",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> =
        String::from_utf8(o.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    for v in &lines {
        assert_eq!(v["runs"], 3);
        let (min, med, max) = (
            v["elapsed_min_s"].as_f64().unwrap(),
            v["elapsed_s"].as_f64().unwrap(),
            v["elapsed_max_s"].as_f64().unwrap(),
        );
        assert!(min <= med && med <= max, "{v}");
    }
    // The second is paired with the first round by round; 3 rounds give
    // no 95 % interval.
    assert!(lines[0].get("vs_first").is_none(), "{}", lines[0]);
    let paired = &lines[1]["vs_first"];
    assert_eq!(paired["rounds"], 3, "{paired}");
    assert!(paired["median"].as_f64().unwrap() > 0.0 && paired["ci95"].is_null(), "{paired}");
}

#[test]
fn six_rounds_or_more_bound_the_paired_ratio() {
    let args = ["sched-bench", "--scheduler", "sequential,late-batch-bitmap", "--workers", "1", "--commands", "2000"];
    let o = psmr(&[&args[..], &["--repeat", "6"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    let row = out.lines().find(|l| l.starts_with("late-batch-bitmap ")).expect("a row");
    // `... 0.97x (0.90-1.10)  digest`: the median inside its interval.
    let (before, after) = row.split_once(" (").expect(row);
    let median: f64 =
        before.rsplit(' ').next().and_then(|m| m.strip_suffix('x')).and_then(|m| m.parse().ok()).expect(row);
    let interval = after.split_once(')').expect(row).0;
    let (low, high) = interval.split_once('-').expect(row);
    let (low, high): (f64, f64) = (low.parse().expect(row), high.parse().expect(row));
    assert!(low <= median && median <= high, "{row}");
    assert!(out.contains("vs_first: throughput over the first line's"), "{out}");
}

#[test]
fn each_scheduler_with_a_graph_runs_with_each_graph_bound() {
    let args = ["sched-bench", "--scheduler", "sequential,late-batch-bitmap,late-cbase", "--workers", "2"];
    let o = psmr(&[&args[..], &["--commands", "2000", "--graph-max", "4,64", "--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> =
        String::from_utf8(o.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let runs: Vec<(&str, Option<u64>)> =
        lines.iter().map(|v| (v["scheduler"].as_str().unwrap(), v["graph_max"].as_u64())).collect();
    let expected = [
        ("sequential", None),
        ("late-batch-bitmap", Some(4)),
        ("late-batch-bitmap", Some(64)),
        ("late-cbase", Some(4)),
        ("late-cbase", Some(64)),
    ];
    assert_eq!(runs, expected);
    assert!(lines.iter().all(|v| v["digest"] == lines[0]["digest"]), "{lines:?}");
    // Without the flag each reports its own default: batches or commands.
    let o = psmr(&[&args[..], &["--commands", "2000", "--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let bounds: Vec<Option<u64>> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["graph_max"].as_u64())
        .collect();
    assert_eq!(bounds, [None, Some(32), Some(150)]);
    let o = psmr(&[&args[..], &["--graph-max", "0"]].concat());
    assert!(!o.status.success() && stderr(&o).contains("--graph-max must be between 1 and 100000, got 0"));
}

#[test]
fn same_seed_same_digest_other_seed_other_digest() {
    let digest = |seed: &str| {
        let o = psmr(&[
            "sched-bench",
            "--scheduler",
            "early",
            "--workers",
            "2",
            "--write-pct",
            "50",
            "--commands",
            "5000",
            "--json",
            "--seed",
            seed,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(o.stdout.split(|&b| b == b'\n').next().unwrap()).unwrap();
        v["digest"].as_str().unwrap().to_string()
    };
    assert_eq!(digest("3"), digest("3"));
    assert_ne!(digest("3"), digest("4"));
}

#[test]
fn table_output_names_every_run() {
    let o =
        psmr(&["sched-bench", "--commands", "5000", "--scheduler", "sequential,late-batch-bitmap", "--workers", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.contains("sequential") && out.contains("late-batch-bitmap"), "{out}");
    assert!(out.contains("all 2 runs agree"), "{out}");
}

#[test]
fn bad_input_is_a_clear_error() {
    fails_with(&["sched-bench", "--scheduler", "fastest"], "unknown scheduler \"fastest\"");
    fails_with(&["sched-bench", "--model", "nope"], "nope");
    fails_with(&["sched-bench", "--service", "queue"], "unknown service");
    fails_with(&["sched-bench", "--workers", "0"], "--workers must be between 1 and 64");
    fails_with(&["sched-bench", "--workers", "two"], "invalid value");
    fails_with(&["sched-bench", "--write-pct", "150"], "150");
    fails_with(&["sched-bench", "--workload", "25-5"], "25-5");
    fails_with(&["sched-bench", "--workload", "a-b-c"], "a-b-c");
    fails_with(&["sched-bench", "--batch", "0"], "--batch must be between");
    fails_with(&["sched-bench", "--commands", "0"], "--commands must be between");
    fails_with(&["sched-bench", "--cost", "huge"], "huge");
    fails_with(&["sched-bench", "--shards", "0"], "shards");
    fails_with(&["sched-bench", "--skew", "2"], "skew");
    fails_with(&["sched-bench", "--write-pct", "10", "--workload", "1-1-1"], "cannot be used with");
    fails_with(
        &["sched-bench", "--scheduler", "early", "--workers", "2", "--mapping", "R=conc:0,1;W=conc:0,1"],
        "rule R.2 broken: class W",
    );
    fails_with(
        &["sched-bench", "--scheduler", "early", "--mapping", "/nonexistent/map.json"],
        "cannot read mapping file",
    );
    fails_with(&["sched-bench", "--service", "kv", "--workload", "10-5-0"], "global");
    fails_with(
        &["sched-bench", "--service", "list", "--model", "sharded-snapshot", "--shards", "2", "--workload", "10-5-50"],
        "global writes",
    );
    fails_with(&["sched-bench", "--bitmap-bits", "0"], "--bitmap-bits must be between");
    fails_with(&["sched-bench", "--repeat", "0"], "--repeat must be between");
    fails_with(&["sched-bench", "--spin", "20000000"], "--spin must be between 0 and 10000000");
    fails_with(&["sched-bench", "--spin=-1"], "invalid value");
    fails_with(&["sched-bench", "--victims", "smart"], "unknown victim policy \"smart\" (known: first, random, next)");
    fails_with(&["sched-bench", "--metrics", "0"], "--metrics must be between 1 and 60000 ms");
    fails_with(&["frobnicate"], "unrecognized subcommand");
}

#[test]
fn a_closed_stdout_ends_quietly() {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_psmr"))
        .args(["sched-bench", "--scheduler", "all", "--commands", "2000", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // like `| head -0`
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn fuzz_runs_a_target_and_prints_the_totals() {
    let o = psmr(&["fuzz", "--inputs", "2000", "--target", "kv-op", "--seed", "9"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("fuzz seed 9: 2000 inputs per target"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("kv-op ")), "{out}");
    let bound =
        if cfg!(feature = "alloc-meter") { "0 inputs over the allocation bound" } else { "allocation not measured" };
    assert!(out.contains(&format!("total: 2000 inputs, 0 crashes, {bound}")), "{out}");
    let o = psmr(&["fuzz", "--inputs", "100", "--target", "entry,resp", "--seed", "9", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert_eq!(v["total_inputs"], 200);
    assert_eq!(v["total_crashes"], 0);
    assert_eq!(v["alloc_measured"], cfg!(feature = "alloc-meter"));
    if cfg!(feature = "alloc-meter") {
        assert!(v["targets"][1]["max_alloc_per_input"].as_u64().is_some_and(|b| b > 0), "{v}");
    }
}

#[test]
fn fuzz_refuses_an_unknown_target() {
    fails_with(&["fuzz", "--inputs", "10", "--target", "kv-nope"], "unknown fuzz target \"kv-nope\"");
}

fn stdout_of(args: &[&str]) -> String {
    let o = psmr(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    String::from_utf8(o.stdout).expect("UTF-8 output")
}

#[test]
fn membership_commands_are_listed_and_documented() {
    let help = stdout_of(&["client", "--help"]);
    for cmd in ["add-replica", "remove-replica", "members"] {
        assert!(help.lines().any(|l| l.trim_start().starts_with(&format!("{cmd} "))), "{cmd} missing:\n{help}");
    }
    let help = stdout_of(&["client", "add-replica", "--help"]);
    assert!(help.contains("<ID> <CLIENT_ADDR> <PEER_ADDR>") && help.contains("psmr replica --join"), "{help}");
    let help = stdout_of(&["replica", "--help"]);
    assert!(help.contains("--join") && help.contains("add-replica"), "{help}");
}

#[test]
fn help_lists_every_accepted_scheduler_and_the_everyday_commands_first() {
    let help = stdout_of(&["client", "reconfigure", "--help"]);
    for kind in psmr::sched::SchedulerKind::ALL {
        assert!(help.contains(kind.name()), "reconfigure --help omits {}:\n{help}", kind.name());
    }
    let help = stdout_of(&["--help"]);
    let at = |cmd: &str| help.find(&format!("\n  {cmd} ")).unwrap_or_else(|| panic!("{cmd} missing:\n{help}"));
    assert!(at("cluster") < at("sched-bench") && at("client") < at("sched-bench"), "{help}");
    assert!(stdout_of(&["rt-bench", "--help"]).lines().next().unwrap().contains("mixer"));
}

#[test]
fn membership_commands_refuse_bad_arguments() {
    fails_with(&["client", "--cluster", "127.0.0.1:1", "add-replica", "4", "notanaddr", "127.0.0.1:2"], "notanaddr");
    fails_with(&["client", "--cluster", "127.0.0.1:1", "add-replica", "4", "127.0.0.1:2", "host:port"], "host:port");
    fails_with(
        &["client", "--cluster", "127.0.0.1:1", "add-replica", "0", "127.0.0.1:2", "127.0.0.1:3"],
        "replica ids start at 1",
    );
    fails_with(&["client", "--cluster", "127.0.0.1:1", "remove-replica", "0"], "replica ids start at 1");
    // Nobody listens on port 1: the error names the replica and why.
    fails_with(&["client", "--cluster", "127.0.0.1:1", "members"], "no replica answered (127.0.0.1:1: cannot connect");
}

/// A port that answers whatever comes with `answer`, once per
/// connection, as a server of another protocol would.
fn impostor(answer: &'static [u8]) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            use std::io::{Read, Write};
            let _ = s.read(&mut [0u8; 256]);
            let _ = s.write_all(answer);
        }
    });
    addr
}

#[test]
fn a_client_command_names_addresses_that_are_not_client_ports() {
    // Nobody listens on port 1: named at once, not after --timeout.
    fails_with(&["client", "--cluster", "127.0.0.1:1", "get", "7"], "127.0.0.1:1: cannot connect");
    fails_with(&["client", "--cluster", "127.0.0.1:1", "put", "7", "v"], "no psmr client port among --cluster");
    // Another protocol's port is named for what it speaks.
    let redis = impostor(b"-ERR Protocol error: invalid multibulk length\r\n");
    fails_with(&["client", "--cluster", &redis, "get", "7"], "speaks RESP (a Redis port?)");
    let tls = impostor(b"\x15\x03\x03\x00\x02\x02\x32");
    fails_with(&["client", "--cluster", &tls, "delete", "7"], "speaks TLS");
    let http = impostor(b"HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n");
    fails_with(&["client", "--cluster", &http, "members"], "speaks HTTP (a metrics port?)");
}

#[test]
fn rt_bench_writes_its_report_and_refuses_bad_settings() {
    let dir = std::env::temp_dir().join(format!("psmr-rt-bench-cli-{}", std::process::id()));
    let out = dir.to_str().unwrap();
    let o = psmr(&[
        "rt-bench",
        "--workload",
        "spawn,mixer,options",
        "--tasks",
        "200",
        "--conferences",
        "2",
        "--policy",
        "fifo,lifo",
        "--out",
        out,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("psmr-rt lifo") && table.contains("tokio") && table.contains("breaches"), "{table}");
    for file in ["results.json", "report.md", "spawn.svg", "mixer-2.svg"] {
        assert!(dir.join(file).is_file(), "{file} missing");
    }
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    let runs = results[1]["runs"].as_array().unwrap();
    assert_eq!((results[1]["conferences"].as_u64(), runs.len()), (Some(2), 3), "fifo, lifo, tokio");
    assert!(runs.iter().all(|r| r["tasks"] == 400 && r["breaches"].is_number()), "{runs:?}");
    // Options' queues grow unless told otherwise, so that FIFO stays FIFO;
    // the others overflow.
    assert_eq!((results[0]["full"].as_str(), results[2]["full"].as_str()), (Some("overflow"), Some("resize")));
    std::fs::remove_dir_all(&dir).ok();
    fails_with(&["rt-bench", "--workload", "packets"], "unknown workload \"packets\"");
    fails_with(&["rt-bench", "--policy", "stack"], "bad policy \"stack\"");
    fails_with(&["rt-bench", "--workload", "mixer", "--silos", "3"], "--silos must be between 1 and the workers (2)");
    fails_with(&["rt-bench", "--victims", "neighbourhood:0"], "bad victims");
    fails_with(&["rt-bench", "--full", "grow"], "bad full \"grow\": overflow or resize");
}

#[test]
fn passwd_prints_a_users_block_a_replica_accepts() {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_psmr"))
        .args(["passwd", "--user", "ops", "--role", "admin", "--iterations", "1000"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"correct horse\n").unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let block = String::from_utf8(o.stdout).unwrap();
    #[derive(serde::Deserialize)]
    struct Users {
        users: Vec<psmr_auth::UserSpec>,
    }
    let users: Users = toml::from_str(&block).unwrap();
    let gate = psmr_auth::Gate::new(&users.users, false).unwrap();
    let source = std::net::IpAddr::from([127, 0, 0, 1]);
    let now = std::time::Instant::now();
    assert_eq!(gate.check(source, b"ops", b"correct horse", now).unwrap().role(), psmr_auth::Role::Admin);
    assert!(gate.check(source, b"ops", b"correct horse\n", now).is_err());
    assert!(!block.contains("correct horse"), "{block}");

    let dir = std::env::temp_dir().join(format!("psmr-passwd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("app.password");
    let o = psmr(&["passwd", "--user", "app", "--generate", file.to_str().unwrap(), "--iterations", "1000"]);
    assert!(o.status.success(), "{}", stderr(&o));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim().len(), 64);
    // Never over an existing file.
    fails_with(&["passwd", "--user", "app", "--generate", file.to_str().unwrap()], "app.password");
    fails_with(&["passwd", "--user", "app", "--role", "root", "--generate", "x"], "unknown role \"root\"");
    fails_with(&["passwd", "--user", "a b", "--generate", "x"], "1 to 64 letters");
    fails_with(&["passwd", "--user", "app", "--iterations", "5", "--generate", "y"], "rounds");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn client_credentials_come_from_the_environment_or_a_file_never_a_flag() {
    // A user without a password is refused before anything is sent.
    let o = Command::new(env!("CARGO_BIN_EXE_psmr"))
        .args(["client", "--cluster", "127.0.0.1:1", "--user", "admin", "get", "k"])
        .env_remove("PSMR_PASSWORD")
        .env_remove("PSMR_PASSWORD_FILE")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--user needs a password"), "{}", stderr(&o));
    fails_with(&["client", "--cluster", "127.0.0.1:1", "--password", "x", "get", "k"], "--password");
    fails_with(
        &["client", "--cluster", "127.0.0.1:1", "--password-file", "/nonexistent/pw", "get", "k"],
        "cannot read /nonexistent/pw",
    );
}

#[test]
fn the_everyday_commands_show_examples() {
    for cmd in ["replica", "cluster", "client", "certs", "passwd"] {
        let o = psmr(&[cmd, "--help"]);
        let help = String::from_utf8_lossy(&o.stdout).into_owned();
        let examples = help.split_once("Examples:\n").map(|(_, e)| e).unwrap_or_default();
        assert!(o.status.success() && examples.contains(&format!("psmr {cmd} ")), "{cmd}:\n{help}");
    }
}

#[test]
fn log_lines_are_json_objects_with_log_format_json() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let held =
        [std::net::TcpListener::bind("127.0.0.1:0").unwrap(), std::net::TcpListener::bind("127.0.0.1:0").unwrap()];
    let (client, peer) = (held[0].local_addr().unwrap(), held[1].local_addr().unwrap());
    drop(held);
    let config = dir.path().join("c.toml");
    let text = format!(
        "storage = \"memory\"\ninsecure_peers = true\ninsecure_clients = true\n\
         [[replicas]]\nid = 1\nclient = \"{client}\"\npeer = \"{peer}\"\n"
    );
    std::fs::write(&config, text).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_psmr"))
        .args(["--log-format", "json", "replica", "--config", config.to_str().unwrap(), "--id", "1"])
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    let mut started = None;
    for line in lines.map_while(Result::ok) {
        if line.contains("replica started") {
            started = Some(line);
            break;
        }
        seen.push(line);
    }
    let _ = child.kill();
    let _ = child.wait();
    let line = started.unwrap_or_else(|| panic!("no start line in {seen:#?}"));
    let object: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(object["level"], "INFO", "{line}");
    assert_eq!(object["fields"]["message"], "replica started", "{line}");
    assert!(object["timestamp"].is_string() && object["target"].is_string(), "{line}");
    for earlier in &seen {
        serde_json::from_str::<serde_json::Value>(earlier).unwrap_or_else(|e| panic!("{e}: {earlier}"));
    }
}

#[test]
fn the_service_unit_verifies_and_the_dockerfile_uses_the_projects_scripts() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let unit = std::fs::read_to_string(root.join("deploy/psmr-replica@.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/psmr replica --config /etc/psmr/cluster.toml --id %i"), "{unit}");
    // Where systemd's own checker exists, the unit passes it without a
    // warning (with this build's binary in place of the installed one).
    let analyze =
        ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"].into_iter().find(|p| std::path::Path::new(p).exists());
    if let Some(analyze) = analyze {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("psmr-replica@1.service");
        std::fs::write(&file, unit.replace("/usr/local/bin/psmr", env!("CARGO_BIN_EXE_psmr"))).unwrap();
        let out = Command::new(analyze).arg("verify").arg(&file).output().unwrap();
        assert!(out.status.success() && out.stderr.is_empty(), "{}", stderr(&out));
    }
    let docker = std::fs::read_to_string(root.join("deploy/Dockerfile")).unwrap();
    assert!(docker.contains("bash scripts/setup.sh") && root.join("scripts/setup.sh").exists(), "{docker}");
    assert!(docker.contains("cargo build --release -p psmr"), "{docker}");
    assert!(docker.contains("COPY --from=build /target/release/psmr /usr/local/bin/psmr"), "{docker}");
    assert!(docker.contains("ENTRYPOINT [\"/usr/local/bin/psmr\"]"), "{docker}");
}

#[test]
fn sighup_reloads_a_replicas_certificates_and_a_bad_file_keeps_the_old() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    psmr::replica::tls::generate(&certs, &[1]).unwrap();
    let held =
        [std::net::TcpListener::bind("127.0.0.1:0").unwrap(), std::net::TcpListener::bind("127.0.0.1:0").unwrap()];
    let (client, peer) = (held[0].local_addr().unwrap(), held[1].local_addr().unwrap());
    drop(held);
    let config = dir.path().join("c.toml");
    let c = certs.display();
    let text = format!(
        "storage = \"memory\"\ninsecure_clients = true\n[[replicas]]\nid = 1\nclient = \"{client}\"\npeer = \"{peer}\"\n\
         [peer_tls]\nca = \"{c}/ca.pem\"\ncert = \"{c}/replica-{{id}}.pem\"\nkey = \"{c}/replica-{{id}}.key\"\n\
         [client_tls]\ncert = \"{c}/replica-{{id}}.pem\"\nkey = \"{c}/replica-{{id}}.key\"\n"
    );
    std::fs::write(&config, text).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_psmr"))
        .args(["replica", "--config", config.to_str().unwrap(), "--id", "1"])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(|l| drop(tx.send(l))));
    // Every line up to the first that holds `needle`; a bound on the wait
    // so that a missing line fails the test instead of hanging it.
    let until = |needle: &str| -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            match rx.recv_timeout(std::time::Duration::from_secs(60)) {
                Ok(line) if line.contains(needle) => return seen,
                Ok(line) => seen.push(line),
                Err(e) => panic!("no {needle:?} ({e}) after {seen:#?}"),
            }
        }
    };
    let hup = || assert!(Command::new("kill").arg("-HUP").arg(child.id().to_string()).status().unwrap().success());
    until("replica started");
    hup();
    until("certificates reloaded");
    std::fs::write(certs.join("replica-1.pem"), "not a certificate").unwrap();
    hup();
    until("certificates not reloaded (the ones in use stay)");
    assert!(child.try_wait().unwrap().is_none(), "the replica runs on with the certificates it had");
    assert!(Command::new("kill").arg("-TERM").arg(child.id().to_string()).status().unwrap().success());
    assert!(child.wait().unwrap().success());
}
