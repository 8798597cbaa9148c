//! A config list that may be written as a single value (`gamma = 4` means `gamma = [4]`).
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, IntoDeserializer, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A list that may be written as a single value (`gamma = 4` means `gamma = [4]`).
/// Serialised as a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct List<T>(pub Vec<T>);

impl<T> std::ops::Deref for List<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T: Serialize> Serialize for List<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for List<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ListVisitor(PhantomData))
    }
}

struct ListVisitor<T>(PhantomData<T>);

impl<T> ListVisitor<T> {
    /// A scalar `v` as a one-element list.
    fn one<'de, E, D>(v: D) -> Result<List<T>, E>
    where
        T: Deserialize<'de>,
        D: de::Deserializer<'de, Error = E>,
    {
        T::deserialize(v).map(|t| List(vec![t]))
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for ListVisitor<T> {
    type Value = List<T>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a value or a list of values")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<List<T>, A::Error> {
        let mut out = Vec::new();
        while let Some(x) = seq.next_element()? {
            out.push(x);
        }
        Ok(List(out))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<List<T>, E> {
        Self::one(v.into_deserializer())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<List<T>, E> {
        Self::one(v.into_deserializer())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<List<T>, E> {
        Self::one(v.into_deserializer())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<List<T>, E> {
        Self::one(v.into_deserializer())
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<List<T>, E> {
        Self::one(v.into_deserializer())
    }
}
