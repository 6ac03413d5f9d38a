//! Bounded memory for bounded bytes: what a ResourceClaim body may hold before it is decoded.
//!
//! The body limit bounds bytes, not memory: two bytes of JSON (`0,`) become a 32-byte
//! value, so a 16 MiB claim of one long array would take hundreds of MiB once decoded.
//! [`check_claim`] walks the body once without building anything (keys are compared in
//! place, values skipped) and refuses a claim that holds more than [`MAX_VALUES`] JSON
//! values, and one whose opaque fields (a config's
//! `opaque.parameters`, a device status's `data`, kept as free JSON) are larger than
//! [`MAX_RAW_BYTES`]: the API server allows them 10 KiB each. A real claim holds a few
//! hundred values; the bound keeps a decoded claim within a few MiB beyond its bytes.
//!
//! Nesting is bounded by serde_json's recursion limit (128 levels), which this walk shares
//! with the decoder: a body nested deeper, or one that is not JSON, passes here and the
//! decoder that follows names what is wrong with it.

use std::cell::Cell;
use std::fmt;

use serde::Deserialize as _;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// Most JSON values (objects, arrays, strings, numbers, booleans, nulls) in one claim.
pub const MAX_VALUES: usize = 100_000;
/// Largest opaque field (`opaque.parameters`, `status.devices[].data`) as sent, in bytes:
/// the API server's 10 KiB with room for whitespace and escapes.
pub const MAX_RAW_BYTES: usize = 16 * 1024;

/// Why a claim body is refused before it is decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// Too many values.
    #[error(
        "the claim holds more than {MAX_VALUES} JSON values, far more than any ResourceClaim the API server \
         accepts; it is not decoded"
    )]
    TooManyValues,
    /// An opaque field is too large.
    #[error(
        "the claim's {field} is {size} bytes, more than the {MAX_RAW_BYTES} edra reads (the API server allows \
         10 KiB); it is not decoded"
    )]
    RawTooLarge {
        /// `opaque.parameters` or `status.devices[].data`.
        field: &'static str,
        /// Its size as sent.
        size: usize,
    },
}

/// Checks a claim body against [`MAX_VALUES`] and [`MAX_RAW_BYTES`] without
/// building it; a body that is not JSON is left to the decoder.
pub fn check_claim(body: &[u8]) -> Result<(), ShapeError> {
    let budget = Budget { values: Cell::new(0), refused: Cell::new(None) };
    let mut de = serde_json::Deserializer::from_slice(body);
    let _ = Walk { budget: &budget, place: Place::Root }.deserialize(&mut de);
    match budget.refused.take() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

struct Budget {
    values: Cell<usize>,
    refused: Cell<Option<ShapeError>>,
}

impl Budget {
    /// Refuses with `e`: the walk stops with a placeholder error, `e` is what is reported.
    fn refuse<E: de::Error>(&self, e: ShapeError) -> E {
        self.refused.set(Some(e));
        E::custom("refused")
    }
}

/// Where a value sits, as far as the opaque fields need to know.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Root,
    /// `status`.
    Status,
    /// `status.devices`.
    StatusDevices,
    /// `status.devices[i]`.
    StatusDevice,
    /// A config's `opaque`.
    Opaque,
    Other,
}

impl Place {
    /// The place of the value under `key` in an object at `self`; `Some(field)` when it is
    /// an opaque field.
    fn child(self, key: Key) -> (Place, Option<&'static str>) {
        match (self, key) {
            (Place::Root, Key::Status) => (Place::Status, None),
            (Place::Status, Key::Devices) => (Place::StatusDevices, None),
            (Place::StatusDevice, Key::Data) => (Place::Other, Some("status.devices[].data")),
            (Place::Opaque, Key::Parameters) => (Place::Other, Some("opaque.parameters")),
            (_, Key::Opaque) => (Place::Opaque, None),
            _ => (Place::Other, None),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    Status,
    Devices,
    Data,
    Opaque,
    Parameters,
    Other,
}

/// A key, compared in place.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for KeySeed {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(match v {
            "status" => Key::Status,
            "devices" => Key::Devices,
            "data" => Key::Data,
            "opaque" => Key::Opaque,
            "parameters" => Key::Parameters,
            _ => Key::Other,
        })
    }
}

/// One value: counted, its children walked.
#[derive(Clone, Copy)]
struct Walk<'b> {
    budget: &'b Budget,
    place: Place,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        let n = self.budget.values.get().saturating_add(1);
        if n > MAX_VALUES {
            return Err(self.budget.refuse(ShapeError::TooManyValues));
        }
        self.budget.values.set(n);
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let place = match self.place {
            Place::StatusDevices => Place::StatusDevice,
            _ => Place::Other,
        };
        while seq.next_element_seed(Walk { place, ..self })?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key_seed(KeySeed)? {
            match self.place.child(key) {
                (_, Some(field)) => map.next_value_seed(Raw { walk: Walk { place: Place::Other, ..self }, field })?,
                (place, None) => map.next_value_seed(Walk { place, ..self })?,
            }
        }
        Ok(())
    }
}

/// An opaque field: its size as sent is checked first, then its values are walked.
struct Raw<'b> {
    walk: Walk<'b>,
    field: &'static str,
}

impl<'de> DeserializeSeed<'de> for Raw<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        // The value's span of the body, borrowed: nothing is copied or built.
        let raw = <&RawValue>::deserialize(d)?;
        let size = raw.get().len();
        if size > MAX_RAW_BYTES {
            return Err(self.walk.budget.refuse(ShapeError::RawTooLarge { field: self.field, size }));
        }
        let mut inner = serde_json::Deserializer::from_str(raw.get());
        match self.walk.deserialize(&mut inner) {
            Ok(()) => Ok(()),
            Err(_) => Err(de::Error::custom("refused")),
        }
    }
}

#[cfg(test)]
mod tests;
