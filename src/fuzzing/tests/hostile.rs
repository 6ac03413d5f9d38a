//! Input generators for the property tests: arbitrary bytes, JSON built from the keys a
//! parser looks for with hostile leaves (huge and negative numbers, odd strings), deep
//! nesting, and token soups that are almost JSON. One fixed seed, so a run is repeatable.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use serde_json::{Map, Value};

/// `cases` cases from a fixed seed; no regression files written.
pub fn config(cases: u32) -> Config {
    Config { cases, rng_seed: RngSeed::Fixed(0x00ed_4a00), failure_persistence: None, ..Config::default() }
}

/// Any bytes, up to `max` of them.
pub fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

/// Numbers a parser may choke on.
fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(Value::from(u64::MAX)),
        Just(Value::from(i64::MIN)),
        Just(Value::from(0)),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f).map(Value::Number)),
        Just(serde_json::json!(1e308)),
    ]
}

/// Strings a parser may choke on.
fn string() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,24}",
        Just(String::new()),
        Just("\u{0}\n\r\t\u{202e}\u{feff}".to_string()),
        Just("https://".to_string()),
        Just("https://[::1]:6443/".to_string()),
        Just("LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==".to_string()),
        Just("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_string()),
        Just("x".repeat(20_000)),
    ]
}

/// JSON values whose object keys come from `keys` (and a few others), whose string leaves
/// come from `strings` (the values the parser compares against) or [`string`], nested up
/// to `depth` levels.
pub fn json(keys: &'static [&'static str], strings: &'static [&'static str], depth: u32) -> BoxedStrategy<Value> {
    let key = prop_oneof![4 => prop::sample::select(keys).prop_map(String::from), 1 => ".{0,8}"];
    let known = prop::sample::select(strings).prop_map(|s| Value::String(s.to_string()));
    let leaf = prop_oneof![
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::Bool),
        1 => number(),
        1 => string().prop_map(Value::String),
        3 => known,
    ];
    leaf.prop_recursive(depth, 256, 8, move |inner| {
        prop_oneof![
            1 => prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            3 => prop::collection::vec((key.clone(), inner), 0..8)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
    .boxed()
}

/// Text nested `depth` times in `[`, `{"k":` or `- ` (YAML), closed or left open.
pub fn deep() -> impl Strategy<Value = Vec<u8>> {
    (1usize..2_000, 0u8..4, any::<bool>()).prop_map(|(depth, kind, close)| {
        let (open, end) = match kind {
            0 => ("[", "]"),
            1 => ("{\"k\":", "}"),
            2 => ("{\"object\":", "}"),
            _ => ("- ", ""),
        };
        let mut s = open.repeat(depth).into_bytes();
        s.extend_from_slice(b"1");
        if close {
            s.extend_from_slice(end.repeat(depth).as_bytes());
        }
        s
    })
}

/// Almost-JSON: a soup of JSON tokens, the given keys and strings, and broken UTF-8.
pub fn soup(words: &'static [&'static str]) -> impl Strategy<Value = Vec<u8>> {
    const TOKENS: &[&[u8]] = &[
        b"{",
        b"}",
        b"[",
        b"]",
        b",",
        b":",
        b"\"",
        b"null",
        b"true",
        b"-1",
        b"0",
        b"1e999",
        b"18446744073709551616",
        b"-9223372036854775809",
        b"\"\\ud800\"",
        b"\\u0000",
        b"\xff\xfe",
        b"\xc3",
        b"\n",
        b" ",
        b"\"a\"",
    ];
    let token = prop_oneof![
        prop::sample::select(TOKENS).prop_map(<[u8]>::to_vec),
        prop::sample::select(words).prop_map(|w| format!("\"{w}\"").into_bytes()),
    ];
    prop::collection::vec(token, 0..64).prop_map(|t| t.concat())
}
