//! The safetensors header and pmstate's `__metadata__` entries, as serde
//! structs. The safetensors crate parses headers into hash maps, where a
//! name given twice silently keeps one of its values; a checkpoint reader
//! must not guess, so the header is parsed here with duplicates refused,
//! then handed to `safetensors::tensor::Metadata::new`, which checks
//! offsets and sizes.

use std::collections::HashSet;
use std::fmt;
use std::marker::PhantomData;

use safetensors::tensor::{Metadata, TensorInfo};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::error::HeaderProblem;

/// The `__metadata__` key of the whole tree, as exact JSON.
pub(crate) const TREE_KEY: &str = "pmstate.tree";
/// The `__metadata__` key of the storage table.
pub(crate) const STORAGES_KEY: &str = "pmstate.storages";
/// The `__metadata__` key of pmstate's layout version.
pub(crate) const VERSION_KEY: &str = "pmstate.version";

/// The most header bytes the safetensors crate (and Python's reader) accept.
pub(crate) const MAX_HEADER_SIZE: usize = 100_000_000;

/// Entries of a JSON object in file order; a key given twice is an error.
pub(crate) struct UniqueMap<V>(pub Vec<(String, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for UniqueMap<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V2<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for V2<V> {
            type Value = UniqueMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object with unique keys")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut seen = HashSet::new();
                let mut out = Vec::new();
                while let Some(k) = map.next_key::<String>()? {
                    if !seen.insert(k.clone()) {
                        return Err(serde::de::Error::custom(format!("duplicate key '{k}'")));
                    }
                    out.push((k, map.next_value()?));
                }
                Ok(UniqueMap(out))
            }
        }
        d.deserialize_map(V2(PhantomData))
    }
}

/// A parsed, validated header: `__metadata__` entries in file order and
/// the tensor metadata.
pub(crate) struct Header {
    pub metadata: Vec<(String, String)>,
    pub tensors: Metadata,
}

/// The key a "duplicate key" error of [`UniqueMap`] names.
fn duplicate_in(e: &serde_json::Error) -> Option<String> {
    let msg = e.to_string();
    msg.strip_prefix("duplicate key '").and_then(|m| m.split_once('\'')).map(|(k, _)| k.to_owned())
}

/// Parses header JSON text. Names and metadata keys must be unique;
/// offsets must tile the data (the safetensors crate's own check).
pub(crate) fn parse(text: &str) -> Result<Header, HeaderProblem> {
    let raw: UniqueMap<Box<RawValue>> = serde_json::from_str(text).map_err(|e| match duplicate_in(&e) {
        Some(k) => HeaderProblem::DuplicateKey(k),
        None => HeaderProblem::Json(e),
    })?;
    let mut metadata = Vec::new();
    let mut tensors = Vec::with_capacity(raw.0.len());
    for (name, value) in raw.0 {
        if name == "__metadata__" {
            let m: UniqueMap<String> = serde_json::from_str(value.get()).map_err(|e| match duplicate_in(&e) {
                Some(k) => HeaderProblem::DuplicateMetadata(k),
                None => HeaderProblem::Json(e),
            })?;
            metadata = m.0;
        } else {
            let info: TensorInfo = serde_json::from_str(value.get()).map_err(HeaderProblem::Json)?;
            tensors.push((name, info));
        }
    }
    tensors.sort_by_key(|(_, info)| info.data_offsets);
    let tensors = Metadata::new(None, tensors).map_err(HeaderProblem::Invalid)?;
    Ok(Header { metadata, tensors })
}

/// One storage of a whole-checkpoint export (`pmstate.storages`): which
/// tensor of the file holds its bytes, and how torch declared it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct StorageEntry {
    pub tensor: String,
    pub typed: bool,
    pub dtype: String,
    pub location: String,
}
