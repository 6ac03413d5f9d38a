use super::*;

fn pod(name: &str, ended: bool, claims: &[&str]) -> PodClaims {
    PodClaims {
        namespace: "ns".into(),
        name: name.into(),
        starting: false,
        ended,
        claims: claims.iter().map(|c| c.to_string()).collect(),
    }
}

#[test]
fn a_claim_is_in_use_while_a_pod_that_has_not_ended_names_it_and_unknown_while_the_watch_cannot_say() {
    let in_use = PodsInUse::default();
    assert_eq!(in_use.uses("ns", "a"), None, "not listed yet");
    in_use.listed(&[pod("p1", false, &["a", "b"]), pod("p2", true, &["c"])]);
    assert_eq!(in_use.uses("ns", "a"), Some(true));
    assert_eq!(in_use.uses("other", "a"), Some(false), "claims are named in the pod's namespace");
    assert_eq!(in_use.uses("ns", "c"), Some(false), "an ended pod holds nothing");
    in_use.applied(&pod("p3", false, &["a"]));
    in_use.deleted(&pod("p1", false, &[]));
    assert_eq!((in_use.uses("ns", "a"), in_use.uses("ns", "b")), (Some(true), Some(false)));
    in_use.applied(&pod("p3", true, &["a"]));
    assert_eq!(in_use.uses("ns", "a"), Some(false), "its last pod ended");
    in_use.applied(&pod("p4", false, &["d"]));
    in_use.lost();
    assert_eq!(in_use.uses("ns", "d"), None, "the watch failed");
    assert_eq!(in_use.pods_of("ns", "d"), None);
    in_use.listed(&[pod("p4", false, &["d"]), pod("p5", false, &["d", "e"])]);
    assert_eq!(in_use.uses("ns", "d"), Some(true));
    assert_eq!(in_use.pods_of("ns", "d"), Some(vec!["p4".to_string(), "p5".to_string()]));
    assert_eq!(in_use.pods_of("ns", "x"), Some(vec![]));
}
