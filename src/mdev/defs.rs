//! Persistent mdev definitions in mdevctl's own format, so one host can use both tools.
//!
//! mdevctl keeps one file per device: `etc/mdevctl.d/<parent>/<uuid>`, pretty-printed JSON
//! (two-space indent, no trailing newline, mode 0644):
//!
//! ```json
//! {
//!   "mdev_type": "mbochs-small",
//!   "start": "auto",
//!   "attrs": [
//!     {
//!       "some_attr": "value"
//!     }
//!   ]
//! }
//! ```
//!
//! `start` is `auto` (created when the parent appears: mdevctl's udev rule, or
//! `gpupass mdev start --auto-all` from a boot unit) or `manual`. `attrs` is an *ordered*
//! list of single-key objects: the attributes are written to `sys/bus/mdev/devices/<uuid>/<k>`
//! in that order after the create. `etc/mdevctl.d/scripts.d/` holds mdevctl's callout and
//! notifier scripts and is not a parent.

use super::{MdevError, MdevUuid};
use crate::change::Part;
use crate::host::{dir_names, read_bounded, HostRoot};
use serde::Serialize;
use serde_json::{Map, Value};
use std::path::PathBuf;

/// A definition file is a few hundred bytes; refuse anything absurd.
const DEF_LIMIT: u64 = 1 << 20;

/// `start` of a definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StartMode {
    Auto,
    Manual,
}

impl StartMode {
    pub fn as_str(self) -> &'static str {
        match self {
            StartMode::Auto => "auto",
            StartMode::Manual => "manual",
        }
    }
}

/// One persistent definition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Definition {
    pub uuid: String,
    pub parent: String,
    pub mdev_type: String,
    pub start: StartMode,
    /// Attributes in the order they are written, as (name, value).
    #[serde(serialize_with = "attrs_as_objects")]
    pub attrs: Vec<(String, String)>,
}

fn attrs_as_objects<S: serde::Serializer>(a: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(a.len()))?;
    for (k, v) in a {
        let mut m = Map::new();
        m.insert(k.clone(), Value::String(v.clone()));
        seq.serialize_element(&m)?;
    }
    seq.end()
}

impl Definition {
    /// The file's content, byte for byte what mdevctl writes.
    pub fn to_mdevctl_json(&self) -> String {
        let attrs: Vec<Value> = self
            .attrs
            .iter()
            .map(|(k, v)| {
                let mut m = Map::new();
                m.insert(k.clone(), Value::String(v.clone()));
                Value::Object(m)
            })
            .collect();
        // serde_json keeps insertion order only with `preserve_order`; build the text in
        // mdevctl's key order explicitly.
        let body = serde_json::to_string_pretty(&serde_json::json!({ "attrs": attrs }))
            .unwrap_or_else(|_| "{\n  \"attrs\": []\n}".into());
        let attrs_part = body
            .trim_start_matches('{')
            .trim_end_matches('}')
            .trim_matches('\n')
            .to_string();
        format!(
            "{{\n  \"mdev_type\": {},\n  \"start\": \"{}\",\n{}\n}}",
            Value::String(self.mdev_type.clone()),
            self.start.as_str(),
            attrs_part
        )
    }

    /// Parse a definition file's content.
    pub fn parse(uuid: &str, parent: &str, text: &str) -> Result<Definition, DefinitionError> {
        let v: Value = serde_json::from_str(text).map_err(DefinitionError::Json)?;
        let o = v.as_object().ok_or(DefinitionError::NotObject)?;
        let mdev_type = o
            .get("mdev_type")
            .and_then(Value::as_str)
            .ok_or(DefinitionError::NoType)?
            .to_string();
        let start = match o.get("start").and_then(Value::as_str) {
            Some("auto") => StartMode::Auto,
            Some("manual") | None => StartMode::Manual,
            Some(other) => return Err(DefinitionError::BadStart(other.to_string())),
        };
        let mut attrs = Vec::new();
        match o.get("attrs") {
            None | Some(Value::Null) => {}
            Some(Value::Array(a)) => {
                for (i, item) in a.iter().enumerate() {
                    let m = item
                        .as_object()
                        .filter(|m| m.len() == 1)
                        .ok_or(DefinitionError::AttrNotSingleKey(i))?;
                    let (k, v) = m.iter().next().ok_or(DefinitionError::AttrNotSingleKey(i))?;
                    let v = match v {
                        Value::String(s) => s.clone(),
                        Value::Number(n) => n.to_string(),
                        Value::Bool(b) => b.to_string(),
                        _ => return Err(DefinitionError::AttrNotString(i, k.clone())),
                    };
                    attrs.push((k.clone(), v));
                }
            }
            Some(_) => return Err(DefinitionError::AttrsNotList),
        }
        Ok(Definition {
            uuid: uuid.to_string(),
            parent: parent.to_string(),
            mdev_type,
            start,
            attrs,
        })
    }
}

/// Why a definition file's content is not a definition (the file is ignored with a warning).
#[derive(Debug, thiserror::Error)]
pub enum DefinitionError {
    #[error("not JSON")]
    Json(#[source] serde_json::Error),
    #[error("not a JSON object")]
    NotObject,
    #[error("no \"mdev_type\" string")]
    NoType,
    #[error("\"start\" is {0:?}, expected \"auto\" or \"manual\"")]
    BadStart(String),
    #[error("attrs[{0}] is not a single-key object")]
    AttrNotSingleKey(usize),
    #[error("attrs[{0}] ({1}) is not a string")]
    AttrNotString(usize, String),
    #[error("\"attrs\" is not a list")]
    AttrsNotList,
}

/// Path of a definition file.
pub(crate) fn path_of(host: &HostRoot, parent: &str, uuid: &str) -> PathBuf {
    host.mdevctl_dir().join(parent).join(uuid)
}

/// All definitions, sorted by (parent, uuid). Unreadable or malformed files are skipped and
/// reported in the second list (a broken file must not hide the others).
pub(crate) fn read_all(host: &HostRoot) -> (Vec<Definition>, Vec<String>) {
    let base = host.mdevctl_dir();
    let mut defs = Vec::new();
    let mut warnings = Vec::new();
    let parents = match dir_names(&base) {
        Ok(p) => p,
        Err(e) => {
            warnings.push(format!("cannot list {}: {e}", host.display(&base)));
            return (defs, warnings);
        }
    };
    for parent in parents {
        let pdir = base.join(&parent);
        if parent == "scripts.d" || parent.starts_with('.') || !pdir.is_dir() {
            continue;
        }
        let files = match dir_names(&pdir) {
            Ok(f) => f,
            Err(e) => {
                warnings.push(format!("cannot list {}: {e}", host.display(&pdir)));
                continue;
            }
        };
        for f in files {
            if f.starts_with('.') {
                continue;
            }
            let p = pdir.join(&f);
            if f.parse::<MdevUuid>().is_err() {
                warnings.push(format!(
                    "ignoring {}: the file name is not a UUID",
                    host.display(&p)
                ));
                continue;
            }
            match read_bounded(&p, DEF_LIMIT) {
                Ok(text) => match Definition::parse(&f.to_ascii_lowercase(), &parent, &text) {
                    Ok(d) => defs.push(d),
                    Err(e) => warnings.push(format!(
                        "ignoring {}: {}",
                        host.display(&p),
                        crate::model::ErrorChain(&e)
                    )),
                },
                Err(e) => warnings.push(format!("cannot read {}: {e}", host.display(&p))),
            }
        }
    }
    (defs, warnings)
}

/// The definition(s) of one UUID (a UUID may be defined under several parents).
pub(crate) fn find<'a>(
    defs: &'a [Definition],
    uuid: &MdevUuid,
    parent: Option<&str>,
) -> Result<&'a Definition, MdevError> {
    let hits: Vec<&Definition> = defs
        .iter()
        .filter(|d| d.uuid == uuid.as_str() && parent.is_none_or(|p| p == d.parent))
        .collect();
    match hits.as_slice() {
        [] => Err(MdevError::NotDefined(uuid.to_string())),
        [d] => Ok(d),
        many => Err(MdevError::Ambiguous {
            uuid: uuid.to_string(),
            parents: many.iter().map(|d| d.parent.clone()).collect(),
        }),
    }
}

/// The part of a plan that writes a definition: one file object (absent, or whatever is
/// there, then the definition), applied by the change engine atomically, journaled, undone
/// by `gpupass recover` after a crash (which also removes the parent's directory the write
/// made, once empty, as `undefine` does).
pub(crate) fn define_part(host: &HostRoot, d: &Definition) -> Part {
    let path = crate::change::logical(host, &path_of(host, &d.parent, &d.uuid));
    let mut p = Part::new(
        super::plan::DOMAIN,
        format!("mdev define of {} ({} on {})", d.uuid, d.mdev_type, d.parent),
    );
    p.file(host, &path, Some(d.to_mdevctl_json()), true);
    p
}

/// The part of a plan that removes a definition file (and its parent directory once empty).
pub(crate) fn undefine_part(host: &HostRoot, d: &Definition) -> Part {
    let path = crate::change::logical(host, &path_of(host, &d.parent, &d.uuid));
    let mut p = Part::new(
        super::plan::DOMAIN,
        format!("mdev undefine of {} ({} on {})", d.uuid, d.mdev_type, d.parent),
    );
    p.file(host, &path, None, true);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_what_mdevctl_writes() {
        let d = Definition {
            uuid: "11111111-2222-4333-8444-555555555555".into(),
            parent: "0000:3b:00.0".into(),
            mdev_type: "nvidia-222".into(),
            start: StartMode::Auto,
            attrs: vec![],
        };
        // Byte for byte the file Debian's mdevctl 1.2.0 writes for `define --auto`.
        assert_eq!(
            d.to_mdevctl_json(),
            "{\n  \"mdev_type\": \"nvidia-222\",\n  \"start\": \"auto\",\n  \"attrs\": []\n}"
        );
        let d2 = Definition {
            attrs: vec![("b".into(), "2".into()), ("a".into(), "1".into())],
            ..d
        };
        let text = d2.to_mdevctl_json();
        assert!(text.contains(
            "\"attrs\": [\n    {\n      \"b\": \"2\"\n    },\n    {\n      \"a\": \"1\"\n    }\n  ]"
        ));
        let back = Definition::parse(&d2.uuid, &d2.parent, &text).unwrap();
        assert_eq!(back, d2);
    }

    #[test]
    fn parse_rejects_garbage_with_reason() {
        for (t, why) in [
            ("[]", "object"),
            ("{}", "mdev_type"),
            ("{\"mdev_type\":\"x\",\"start\":\"often\"}", "start"),
            (
                "{\"mdev_type\":\"x\",\"attrs\":[{\"a\":\"1\",\"b\":\"2\"}]}",
                "single-key",
            ),
            ("{\"mdev_type\":\"x\",\"attrs\":{}}", "list"),
            ("{", "JSON"),
        ] {
            let e = crate::model::ErrorChain(&Definition::parse("u", "p", t).unwrap_err()).to_string();
            assert!(e.contains(why), "{t}: {e}");
        }
        let d = Definition::parse("u", "p", "{\"mdev_type\":\"x\",\"attrs\":[{\"n\":3}]}").unwrap();
        assert_eq!(d.start, StartMode::Manual);
        assert_eq!(d.attrs, vec![("n".to_string(), "3".to_string())]);
    }
}
