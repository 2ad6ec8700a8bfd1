//! Reading a JSON body into a typed shape, every error naming its field as a
//! path (`items[0].quantity`, `""` for the body itself). serde does the
//! reading and refuses unknown fields; serde_path_to_error (already in the
//! tree through axum's `Json`) says where it stopped.

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;

use super::validation::ValidationError;

/// `body` as `T`, which must be a JSON object. A serde error becomes a
/// [`ValidationError`] on the path where it happened.
pub(super) fn from_json<'de, T: Deserialize<'de>>(body: &'de Value) -> Result<T, ValidationError> {
    match serde_path_to_error::deserialize::<_, Object<T>>(body) {
        Ok(Object(value)) => Ok(value),
        Err(error) => {
            if error.path().iter().next().is_none() {
                Err(ValidationError::new(
                    "",
                    format!("the body is invalid: {}", error.inner()),
                ))
            } else {
                Err(ValidationError::new(
                    error.path().to_string(),
                    format!("is invalid: {}", error.inner()),
                ))
            }
        }
    }
}

/// `value`, or "is required" on `field`. Fields are read as `Option`s so that a
/// missing (or `null`) one is named itself, not the object around it.
pub(super) fn required<T>(
    value: Option<T>,
    field: impl Into<String>,
) -> Result<T, ValidationError> {
    value.ok_or_else(|| ValidationError::new(field, "is required"))
}

/// A `T` that was a JSON object. A derived struct also deserializes from an
/// array, by position (`["ada@example.com", ...]`), which no body of ours may be.
#[derive(Debug)]
pub(super) struct Object<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
            type Value = T;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                // `map` is serde_path_to_error's, so the path goes on being tracked.
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }

        deserializer
            .deserialize_map(ObjectVisitor(PhantomData))
            .map(Object)
    }
}
