//! Property tests of what the OCI hooks parse: the container state on stdin, the bundle's
//! config.json, `--link` arguments and the driver's params file. Hostile input is an
//! error (exit code 2 for bad input), never a panic; valid input finds the rootfs.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::hostile::{bytes, config, deep, json as json_of, soup};

const STATE_KEYS: &[&str] = &["ociVersion", "id", "status", "pid", "bundle", "annotations", "root", "path", "readonly"];
const STATE_STRINGS: &[&str] = &["1.2.0", "creating", "rootfs", "/", ".", "..", "/nonexistent", "config.json"];

proptest! {
    #![proptest_config(config(1_000))]

    #[test]
    fn hook_state_never_panics(
        state in prop_oneof![bytes(512), soup(STATE_KEYS), deep(), json_of(STATE_KEYS, STATE_STRINGS, 5).prop_map(|v| v.to_string().into_bytes())],
        bundle_config in prop_oneof![bytes(512), soup(STATE_KEYS), deep(), json_of(STATE_KEYS, STATE_STRINGS, 5).prop_map(|v| v.to_string().into_bytes())],
    ) {
        let dir = tempfile::tempdir().expect("a temporary folder");
        for c in crate::fuzzing::hook_state(dir.path(), &state, &bundle_config).into_iter().flatten() {
            prop_assert!(c.rootfs.is_dir());
        }
    }

    #[test]
    fn hook_state_finds_the_rootfs(
        pid in prop_oneof![Just(json!(null)), any::<i64>().prop_map(Value::from), Just(json!(u64::MAX)), Just(json!(-1))],
        relative in any::<bool>(),
        name in "[a-z]{1,12}",
    ) {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let rootfs = dir.path().join(&name);
        std::fs::create_dir(&rootfs).expect("a rootfs folder");
        let root = if relative { name.clone() } else { rootfs.display().to_string() };
        let bundle_config = json!({"ociVersion": "1.2.0", "root": {"path": root}}).to_string();
        let state = json!({"ociVersion": "1.2.0", "id": "c", "status": "creating", "pid": pid, "bundle": "/elsewhere"});
        let results = crate::fuzzing::hook_state(dir.path(), state.to_string().as_bytes(), bundle_config.as_bytes());
        let [_, with_bundle] = results.as_slice() else { panic!("the state is an object: {results:?}") };
        // The state's pid is not used (runtimes disagree on it), whatever its value.
        let c = with_bundle.as_ref().map_err(|e| TestCaseError::fail(e.clone()))?;
        prop_assert_eq!(&c.rootfs, &rootfs);
    }

    #[test]
    fn hook_args_never_panic(text in prop_oneof![".{0,64}", "(ModifyDeviceFiles|::|/|\\.\\.|:|\n| |0|1|\u{0}){0,24}"]) {
        let (link, params) = crate::fuzzing::hook_args(&text, &text);
        if let Ok(link) = link {
            prop_assert!(link.is_absolute());
        }
        if let Some(params) = params {
            prop_assert!(params.contains("ModifyDeviceFiles: 0"));
        }
    }
}
