use super::*;

fn claim(ns: &str, name: &str, uid: &str) -> ClaimRef {
    ClaimRef { namespace: ns.into(), name: name.into(), uid: uid.into() }
}

#[test]
fn reports_count_claims_and_classify_the_call() {
    let started = Instant::now();
    let mut outcomes: Outcomes<()> = BTreeMap::new();
    let r = report(DraMethod::Prepare, "v1", &Ok(outcomes.clone()), started);
    assert_eq!((r.outcome, r.claims_ok, r.claims_failed), (CallOutcome::Ok, 0, 0));
    outcomes.insert("u1".into(), Ok(()));
    outcomes.insert("u2".into(), Err("no such device".into()));
    outcomes.insert("u3".into(), Ok(()));
    let r = report(DraMethod::Unprepare, "v1beta1", &Ok(outcomes), started);
    assert_eq!((r.method, r.version), (DraMethod::Unprepare, "v1beta1"));
    assert_eq!((r.outcome, r.claims_ok, r.claims_failed), (CallOutcome::ClaimErrors, 2, 1));
    let r = report::<()>(DraMethod::Prepare, "v1", &Err(Status::invalid_argument("dup")), started);
    assert_eq!((r.outcome, r.claims_ok, r.claims_failed), (CallOutcome::Failed, 0, 0));
}

#[test]
fn empty_requests_are_fine() {
    let checked = validate::<()>(Vec::new()).expect("valid");
    assert!(checked.valid.is_empty() && checked.errors.is_empty());
}

#[test]
fn missing_namespace_or_name_is_a_per_claim_error() {
    let checked =
        validate::<()>(vec![claim("ns", "a", "u1"), claim("", "b", "u2"), claim("ns", "", "u3"), claim("", "", "u4")])
            .expect("valid");
    assert_eq!(checked.valid, vec![claim("ns", "a", "u1")]);
    let errors: Vec<_> = checked.errors.iter().map(|(uid, e)| (uid.as_str(), e.clone().unwrap_err())).collect();
    assert_eq!(errors.len(), 3);
    assert!(errors[0].1.contains("no namespace;"), "{}", errors[0].1);
    assert!(errors[1].1.contains("no name;"), "{}", errors[1].1);
    assert!(errors[2].1.contains("no namespace and name"), "{}", errors[2].1);
}

#[test]
fn a_missing_uid_fails_the_call_naming_the_index() {
    let status = validate::<()>(vec![claim("ns", "a", "u1"), claim("ns", "b", "")]).err().expect("rejected");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("index 1 (ns/b)"), "{}", status.message());
}

#[test]
fn duplicate_uids_fail_the_call_naming_the_uid() {
    let status = validate::<()>(vec![claim("ns", "a", "u1"), claim("ns", "b", "u1")]).err().expect("rejected");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("claim UID u1"), "{}", status.message());
}
