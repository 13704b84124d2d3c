use super::*;

fn listed(etag: &str, size: u64, mtime: i64) -> Listed {
    Listed {
        rel: "m.zstn".into(),
        size,
        etag: etag.into(),
        mtime,
    }
}

#[test]
fn versions_compare_by_etag_else_by_time() {
    let a = listed("\"e1\"", 10, 100);
    assert!(a.same_version(&listed("\"e1\"", 10, 200)), "ETag decides");
    assert!(!a.same_version(&listed("\"e2\"", 10, 100)));
    assert!(!a.same_version(&listed("\"e1\"", 11, 100)), "size too");
    // A listing without ETags (s3s-fs) against a version known from
    // an upload: the time decides.
    assert!(a.same_version(&listed("", 10, 100)));
    assert!(!a.same_version(&listed("", 10, 101)));
    assert!(listed("", 10, 100).same_version(&listed("", 10, 100)));
    assert!(!listed("", 10, 100).same_version(&listed("", 9, 100)));
    // Two versions without ETags get different names.
    assert_ne!(
        listed("", 10, 100).version_key(),
        listed("", 10, 101).version_key()
    );
    assert_eq!(a.version_key(), "\"e1\"");
}

#[test]
fn a_response_of_another_version_is_refused() {
    let meta = |etag: Option<&str>, secs: i64| object_store::ObjectMeta {
        location: ObjPath::from("m.zstn"),
        last_modified: chrono::DateTime::from_timestamp(secs, 0).unwrap(),
        size: 10,
        e_tag: etag.map(str::to_string),
        version: None,
    };
    let v = Version {
        etag: "\"e1\"",
        mtime: 100,
    };
    assert!(v.check("m", &meta(Some("\"e1\""), 500)).is_ok());
    let e = v.check("m", &meta(Some("\"e2\""), 100)).unwrap_err();
    assert!(e.to_string().contains("changed on the server"), "{e}");
    // No ETag in the response: the time decides.
    assert!(v.check("m", &meta(None, 100)).is_ok());
    assert!(v.check("m", &meta(None, 101)).is_err());
    // A version known by its time only.
    let v = Version {
        etag: "",
        mtime: 100,
    };
    assert!(v.check("m", &meta(Some("\"e9\""), 100)).is_ok());
    assert!(v.check("m", &meta(Some("\"e9\""), 99)).is_err());
    let o = v.options(0..4);
    assert_eq!(o.if_match, None);
    assert_eq!(o.if_unmodified_since.map(|t| t.timestamp()), Some(100));
}

#[test]
fn urls() {
    let u = S3Url::parse("s3://b/models/x/").unwrap().unwrap();
    assert_eq!(u.bucket, "b");
    assert_eq!(u.prefix, "models/x");
    assert_eq!(u.key("a.zstn"), "models/x/a.zstn");
    let u = S3Url::parse("s3://b").unwrap().unwrap();
    assert_eq!(u.key("a"), "a");
    assert!(S3Url::parse("/local").is_none());
    assert!(S3Url::parse("s3:///p").unwrap().is_err());
    assert!(S3Url::parse("s3://b/../x").unwrap().is_err());
}
