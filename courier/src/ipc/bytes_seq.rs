//! `Vec<u8>` and `[u8]` fields without serde's per-byte loops.
//!
//! serde serializes a `Vec<u8>` as a sequence of `u8`, one `serialize_u8`
//! call per byte, and deserializes it with one `next_element` and one `push`
//! per byte: ~2 ns a byte in any format, ~85% of a 128 KiB typed message's
//! cost (ipc-channel's typed `Vec<u8>` runs 17-20x slower than its own bytes
//! channel at 64 KiB). In postcard a sequence of `u8` and a byte string are
//! the same bytes on the wire (a varint length, then the bytes), so courier
//! writes and reads the one as the other, when it can tell for certain that
//! it is looking at one:
//!
//! * writing, [`Fast`] wraps postcard's serializer and takes a sequence whose
//!   iterator is a `slice::Iter<u8>` (serde's impls for `Vec<u8>`, `[u8]`,
//!   `Box<[u8]>`...) as one `serialize_bytes`: one copy, or none at all for a
//!   large one, which `handles` sends from the caller's memory;
//! * reading, `split::Wrap` takes serde's own visitor for `Vec<u8>` (its
//!   type found once by [`vec_u8_visitor`]) as a byte-string read, which
//!   also lets the receiver land a large one in its own buffer.
//!
//! Types are told apart by `TypeId` (through the `typeid` crate, which
//! allows types that are not `'static`: lifetimes do not change the layout
//! of a `slice::Iter` or a `Vec<u8>`), never by size or name, so a sequence
//! of any other element type, or a user's own visitor, takes serde's path
//! unchanged.
#![allow(unsafe_code)]

use std::any::TypeId;
use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::sync::OnceLock;

use postcard::ser_flavors::Flavor;
use serde::de::{self, Deserialize, Deserializer, Visitor};
use serde::ser::{self, Serialize, Serializer};

/// `postcard::serialize_with_flavor`, with sequences of bytes written whole.
pub(crate) fn serialize_with_flavor<T, F>(value: &T, flavor: F) -> postcard::Result<F::Output>
where
    T: Serialize + ?Sized,
    F: Flavor,
{
    let mut serializer = postcard::Serializer { output: flavor };
    value.serialize(Fast(&mut serializer))?;
    serializer
        .output
        .finalize()
        .map_err(|_| postcard::Error::SerializeBufferFull)
}

/// What serde's impls for `Vec<u8>`, `[u8]` and the like iterate.
type ByteIter<'a> = std::slice::Iter<'a, u8>;

/// postcard's serializer, except for [`Serializer::collect_seq`].
pub(crate) struct Fast<'a, F: Flavor>(&'a mut postcard::Serializer<F>);

impl<F: Flavor> Fast<'_, F> {
    /// The wrapped serializer, for one call.
    fn inner(&mut self) -> &mut postcard::Serializer<F> {
        self.0
    }
}

macro_rules! forward_primitives {
    ($($method:ident($ty:ty);)*) => {$(
        #[inline]
        fn $method(self, v: $ty) -> postcard::Result<()> {
            self.0.$method(v)
        }
    )*};
}

/// Starts a compound the way postcard does (it writes a length or a variant
/// index, if anything), then carries on as `Fast`: the compound's elements
/// must come back through `Fast` too.
macro_rules! forward_compounds {
    ($($method:ident($($arg:ident: $ty:ty),*);)*) => {$(
        #[inline]
        fn $method(self, $($arg: $ty),*) -> postcard::Result<Self> {
            (&mut *self.0).$method($($arg),*)?;
            Ok(self)
        }
    )*};
}

impl<'a, F: Flavor> Serializer for Fast<'a, F> {
    type Ok = ();
    type Error = postcard::Error;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    forward_primitives! {
        serialize_bool(bool); serialize_i8(i8); serialize_i16(i16); serialize_i32(i32);
        serialize_i64(i64); serialize_i128(i128); serialize_u8(u8); serialize_u16(u16);
        serialize_u32(u32); serialize_u64(u64); serialize_u128(u128); serialize_f32(f32);
        serialize_f64(f64); serialize_char(char); serialize_str(&str); serialize_bytes(&[u8]);
    }

    fn is_human_readable(&self) -> bool {
        false
    }

    #[inline]
    fn serialize_none(self) -> postcard::Result<()> {
        (&mut *self.0).serialize_none()
    }

    #[inline]
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> postcard::Result<()> {
        (&mut *self.0).serialize_u8(1)?;
        value.serialize(self)
    }

    #[inline]
    fn serialize_unit(self) -> postcard::Result<()> {
        (&mut *self.0).serialize_unit()
    }

    #[inline]
    fn serialize_unit_struct(self, name: &'static str) -> postcard::Result<()> {
        (&mut *self.0).serialize_unit_struct(name)
    }

    #[inline]
    fn serialize_unit_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
    ) -> postcard::Result<()> {
        (&mut *self.0).serialize_unit_variant(name, index, variant)
    }

    #[inline]
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> postcard::Result<()> {
        value.serialize(self)
    }

    #[inline]
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        index: u32,
        _variant: &'static str,
        value: &T,
    ) -> postcard::Result<()> {
        // postcard writes a variant index as a varint `u32`.
        (&mut *self.0).serialize_u32(index)?;
        value.serialize(self)
    }

    forward_compounds! {
        serialize_seq(len: Option<usize>);
        serialize_tuple(len: usize);
        serialize_tuple_struct(name: &'static str, len: usize);
        serialize_tuple_variant(name: &'static str, index: u32, variant: &'static str, len: usize);
        serialize_map(len: Option<usize>);
        serialize_struct(name: &'static str, len: usize);
        serialize_struct_variant(name: &'static str, index: u32, variant: &'static str, len: usize);
    }

    fn collect_str<T: std::fmt::Display + ?Sized>(self, value: &T) -> postcard::Result<()> {
        (&mut *self.0).collect_str(value)
    }

    /// A sequence that iterates a byte slice is written as the byte string it
    /// is on the wire; any other takes serde's way, element by element.
    #[inline]
    fn collect_seq<I>(self, iter: I) -> postcard::Result<()>
    where
        I: IntoIterator,
        I::Item: Serialize,
    {
        let iter = iter.into_iter();
        if typeid::of::<I::IntoIter>() == TypeId::of::<ByteIter<'static>>() {
            let iter = ManuallyDrop::new(iter);
            // SAFETY: `I::IntoIter` is `slice::Iter<'_, u8>` (equal `TypeId`s: the same type up
            // to lifetimes, which do not change its layout), and the slice it hands out is
            // only read during this call, while the caller's value it borrows is alive.
            let bytes: ByteIter<'_> = unsafe { std::mem::transmute_copy(&*iter) };
            return (&mut *self.0).serialize_bytes(bytes.as_slice());
        }
        let len = match iter.size_hint() {
            (lo, Some(hi)) if lo == hi => Some(lo),
            _ => None,
        };
        let mut seq = self.serialize_seq(len)?;
        for item in iter {
            ser::SerializeSeq::serialize_element(&mut seq, &item)?;
        }
        ser::SerializeSeq::end(seq)
    }
}

macro_rules! compound {
    ($($trait:ident { $($method:ident($($arg:ident: $ty:ty),*);)* })*) => {$(
        impl<F: Flavor> ser::$trait for Fast<'_, F> {
            type Ok = ();
            type Error = postcard::Error;
            $(
                #[inline]
                fn $method<T: Serialize + ?Sized>(
                    &mut self,
                    $($arg: $ty,)*
                    value: &T,
                ) -> postcard::Result<()> {
                    $(let _ = $arg;)*
                    value.serialize(Fast(self.inner()))
                }
            )*
            #[inline]
            fn end(self) -> postcard::Result<()> {
                Ok(())
            }
        }
    )*};
}

// postcard's compound serializers write each element, key, value or field in
// turn, and nothing at the end (no names, no lengths).
compound! {
    SerializeSeq { serialize_element(); }
    SerializeTuple { serialize_element(); }
    SerializeTupleStruct { serialize_field(); }
    SerializeTupleVariant { serialize_field(); }
    SerializeMap { serialize_key(); serialize_value(); }
    SerializeStruct { serialize_field(key: &'static str); }
    SerializeStructVariant { serialize_field(key: &'static str); }
}

/// The type of serde's own visitor for `Vec<u8>`, found once by asking
/// serde to deserialize one from a deserializer that only looks; `None` if
/// serde ever stops deserializing a `Vec<u8>` with `deserialize_seq`.
pub(crate) fn vec_u8_visitor() -> Option<TypeId> {
    static VISITOR: OnceLock<Option<TypeId>> = OnceLock::new();
    *VISITOR.get_or_init(|| {
        let seen = Cell::new(None);
        let _ = Vec::<u8>::deserialize(Probe(&seen));
        seen.get()
    })
}

/// Whether `V` is serde's visitor for `Vec<u8>`, whose value is a `Vec<u8>`.
#[inline]
pub(crate) fn is_vec_u8_visitor<'de, V: Visitor<'de>>() -> bool {
    typeid::of::<V::Value>() == TypeId::of::<Vec<u8>>()
        && Some(typeid::of::<V>()) == vec_u8_visitor()
}

/// `bytes` as the value of `V`, serde's visitor for `Vec<u8>`.
///
/// # Panics
/// If `V::Value` is not `Vec<u8>` (callers check [`is_vec_u8_visitor`] first).
pub(crate) fn into_value<'de, V: Visitor<'de>>(bytes: Vec<u8>) -> V::Value {
    assert!(typeid::of::<V::Value>() == TypeId::of::<Vec<u8>>());
    // SAFETY: `V::Value` is `Vec<u8>` (asserted: equal `TypeId`s, and `Vec<u8>` has no
    // lifetimes), and `bytes` is not dropped here, so ownership moves to the result.
    unsafe { std::mem::transmute_copy(&ManuallyDrop::new(bytes)) }
}

/// A visitor for a byte string, as a `Vec<u8>`.
pub(crate) struct ByteVec;

impl<'de> Visitor<'de> for ByteVec {
    type Value = Vec<u8>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a byte string")
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
        Ok(v.to_vec())
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
        Ok(v)
    }
}

/// Records the visitor `deserialize_seq` is called with; fails every call.
struct Probe<'a>(&'a Cell<Option<TypeId>>);

impl<'de> Deserializer<'de> for Probe<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("only looking"))
    }

    fn deserialize_seq<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        self.0.set(Some(typeid::of::<V>()));
        Err(de::Error::custom("only looking"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use serde::{Deserialize, Serialize};

    use super::*;

    fn ours<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
        serialize_with_flavor(value, postcard::ser_flavors::AllocVec::new()).unwrap()
    }

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    enum Shape {
        Empty,
        Blob(Vec<u8>),
        Pair { a: Vec<u8>, b: Option<Box<[u8]>> },
        Nested(Vec<Vec<u8>>, VecDeque<u8>, [u8; 3], Vec<u16>),
    }

    #[test]
    fn the_same_bytes_as_postcard() {
        let values = [
            Shape::Empty,
            Shape::Blob(Vec::new()),
            Shape::Blob((0..=255).collect()),
            Shape::Pair {
                a: vec![7; 300],
                b: Some(vec![1, 2, 3].into_boxed_slice()),
            },
            Shape::Nested(
                vec![vec![], vec![9; 200]],
                (0..130).collect(),
                [4, 5, 6],
                vec![1, 300, 70_000u32 as u16],
            ),
        ];
        for value in &values {
            let bytes = ours(value);
            assert_eq!(bytes, postcard::to_allocvec(value).unwrap(), "{value:?}");
            assert_eq!(&postcard::from_bytes::<Shape>(&bytes).unwrap(), value);
        }
        let slice: &[u8] = &[3; 1000];
        assert_eq!(ours(slice), postcard::to_allocvec(slice).unwrap());
        let strings = vec!["a".to_owned(), "bc".to_owned()];
        assert_eq!(ours(&strings), postcard::to_allocvec(&strings).unwrap());
    }

    #[test]
    fn serde_reads_a_vec_u8_with_deserialize_seq() {
        assert!(vec_u8_visitor().is_some());
        // Other element types and other visitors are told apart.
        let seen = Cell::new(None);
        let _ = Vec::<u16>::deserialize(Probe(&seen));
        assert!(seen.get().is_some());
        assert_ne!(seen.get(), vec_u8_visitor());
        let _ = VecDeque::<u8>::deserialize(Probe(&seen));
        assert_ne!(seen.get(), vec_u8_visitor());
    }
}
