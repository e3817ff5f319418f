//! `docs/config.md`, the configuration reference, against the code: every
//! key of the configuration is listed and nothing else; each default is
//! `Config::default()`'s; each bound is where `Config::validate` starts
//! refusing the key.

use psmr_core::config::{ClientTls, Config, Member, PeerTls};
use toml::{Table, Value};

const DOC: &str = include_str!("../../../docs/config.md");

/// One row of the reference: its key (dotted below a table), default and
/// bounds as written.
struct Row {
    key: String,
    default: String,
    bounds: String,
}

fn rows() -> Vec<Row> {
    DOC.lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<String> =
                l.split(" | ").map(|c| c.trim_matches(|ch| ch == '|' || ch == ' ' || ch == '`').to_string()).collect();
            Row { key: cells[0].clone(), default: cells[2].clone(), bounds: cells[3].clone() }
        })
        .collect()
}

/// A valid configuration that has every optional table.
fn full() -> Config {
    let m = |id: u64| {
        let addr = |port: u64| format!("127.0.0.1:{port}").parse().unwrap();
        Member::new(id, addr(7000 + id), addr(7100 + id))
    };
    let peer_tls = PeerTls { ca: "ca.pem".into(), cert: "c.pem".into(), key: "c.key".into() };
    Config {
        replicas: vec![m(1), m(2), m(3)],
        peer_tls: Some(peer_tls),
        insecure_clients: true,
        client_tls: Some(ClientTls::new("c.pem".into(), "c.key".into())),
        ..Config::default()
    }
}

fn table(c: &Config) -> Table {
    Table::try_from(c).unwrap()
}

/// The value at dotted `key` of `t`.
fn at<'t>(t: &'t Table, key: &str) -> Option<&'t Value> {
    let mut parts = key.split('.');
    let first = t.get(parts.next()?)?;
    parts.try_fold(first, |v, p| v.as_table()?.get(p))
}

fn set(t: &mut Table, key: &str, value: i64) {
    match key.split_once('.') {
        Some((outer, inner)) => {
            t.get_mut(outer).unwrap().as_table_mut().unwrap().insert(inner.into(), Value::Integer(value));
        }
        None => {
            t.insert(key.into(), Value::Integer(value));
        }
    }
}

#[test]
fn every_key_is_listed_and_nothing_else() {
    let t = table(&full());
    let listed: Vec<String> = rows().into_iter().map(|r| r.key).collect();
    let shown =
        |k: &String| listed.iter().any(|l| l == k || l.strip_prefix(k.as_str()).is_some_and(|r| r.starts_with('.')));
    let missing: Vec<&String> = t.keys().filter(|k| !shown(k)).collect();
    assert!(missing.is_empty(), "docs/config.md does not list {missing:?}");
    let defaults = table(&Config { users: vec![], ..full() });
    let unknown: Vec<&String> = listed.iter().filter(|k| at(&defaults, k).is_none() && *k != "users").collect();
    assert!(unknown.is_empty(), "docs/config.md lists keys the configuration has not: {unknown:?}");
}

#[test]
fn every_default_is_the_codes() {
    let defaults = table(&Config::default());
    let tls = Table::try_from(ClientTls::new("c.pem".into(), "c.key".into())).unwrap();
    let mut checked = 0;
    for row in rows() {
        let Ok(shown) = format!("v = {}", row.default).parse::<Table>() else { continue };
        let code = match row.key.strip_prefix("client_tls.") {
            Some(k) => tls.get(k),
            None => at(&defaults, &row.key),
        };
        assert_eq!(code, shown.get("v"), "the default of {}", row.key);
        checked += 1;
    }
    assert!(checked > 35, "only {checked} defaults checked");
}

/// A bound as written: a number, a key (its value in `t`), `key/2` or
/// `key+1`.
fn bound(t: &Table, s: &str) -> i64 {
    if let Ok(n) = s.parse() {
        return n;
    }
    let value = |k: &str| at(t, k).and_then(Value::as_integer).unwrap_or_else(|| panic!("bound {s}: no key {k}"));
    match (s.split_once('/'), s.split_once('+')) {
        (Some((k, d)), _) => value(k) / d.parse::<i64>().unwrap(),
        (_, Some((k, a))) => value(k) + a.parse::<i64>().unwrap(),
        _ => value(s),
    }
}

/// Whether the configuration `t` with `key` at `value` is refused, and
/// why.
fn refusal(t: &Table, key: &str, value: i64) -> Option<String> {
    let mut t = t.clone();
    set(&mut t, key, value);
    let c: Config = t.try_into().ok()?;
    c.validate().err().map(|e| e.to_string())
}

#[test]
fn every_bound_is_where_the_check_starts_refusing() {
    let t = table(&full());
    let mut checked = 0;
    for row in rows().into_iter().filter(|r| r.bounds.contains("..")) {
        let (lo, hi) = row.bounds.split_once("..").unwrap();
        let key = &row.key;
        let (lo, hi) = (bound(&t, lo), hi.strip_prefix('=').map(|h| bound(&t, h)));
        // The check's message starts with the key it refuses.
        let names_key = |v: i64| {
            refusal(&t, key, v).is_some_and(|why| [" must", " ("].iter().any(|w| why.contains(&format!(": {key}{w}"))))
        };
        assert!(!names_key(lo), "{key} = {lo}, its lower bound, is refused: {:?}", refusal(&t, key, lo));
        if lo > 0 {
            assert!(refusal(&t, key, lo - 1).is_some(), "{key} = {} is accepted", lo - 1);
        }
        if let Some(hi) = hi {
            assert!(!names_key(hi), "{key} = {hi}, its upper bound, is refused: {:?}", refusal(&t, key, hi));
            assert!(refusal(&t, key, hi + 1).is_some(), "{key} = {} is accepted", hi + 1);
        }
        checked += 1;
    }
    assert!(checked >= 30, "only {checked} bounds checked");
}
