//! Reading a JSON object whose one field is a large list without building that list: serde
//! visitors shared by the eval-file loader and the stored-definition planner. Written here
//! because this is what serde's `DeserializeSeed` is for; no crate does it for one field.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// An object read as its fields but `key`, as JSON values, and `key` read with `seed` (`None`
/// when absent). Anything but an object is an error, and so is a repeated `key`: a second
/// pass over the list (reading its items in chunks) would see both lists, where a whole read
/// keeps the last; the caller reads such a file whole.
pub struct SplitField<S> {
    pub key: &'static str,
    pub seed: S,
}

impl<'de, S: DeserializeSeed<'de> + Clone> Visitor<'de> for SplitField<S> {
    type Value = (Map<String, Value>, Option<S::Value>);

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "an object with `{}`", self.key)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut top = Map::new();
        let mut field = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == self.key {
                if field.is_some() {
                    return Err(serde::de::Error::duplicate_field(self.key));
                }
                field = Some(map.next_value_seed(self.seed.clone())?);
            } else {
                let value: Value = map.next_value()?;
                top.insert(key, value);
            }
        }
        Ok((top, field))
    }
}

/// An object read for its field `key` alone, with `seed` (`None` when absent); the other
/// fields are skipped unbuilt. Anything but an object is an error, and so is a repeated `key`.
pub struct OnlyField<S> {
    pub key: &'static str,
    pub seed: S,
}

impl<'de, S: DeserializeSeed<'de>> Visitor<'de> for OnlyField<S> {
    type Value = Option<S::Value>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "an object with `{}`", self.key)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seed = Some(self.seed);
        let mut field = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == self.key {
                let Some(seed) = seed.take() else {
                    return Err(serde::de::Error::duplicate_field(self.key));
                };
                field = Some(map.next_value_seed(seed)?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(field)
    }
}

/// A list's length, its items not built. Anything but a list is an error.
#[derive(Debug, Clone, Copy)]
pub struct ListLength;

impl<'de> DeserializeSeed<'de> for ListLength {
    type Value = usize;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<usize, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ListLength {
    type Value = usize;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        let mut n = 0;
        while seq.next_element::<IgnoredAny>()?.is_some() {
            n += 1;
        }
        Ok(n)
    }
}
