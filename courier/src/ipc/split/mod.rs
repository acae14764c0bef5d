//! Receiving a message's first large byte string into a buffer of its own.
//!
//! A `serde_bytes` field deserializes through `deserialize_byte_buf`, and its
//! visitor copies the bytes out of the receive buffer unless the deserializer
//! hands it an owned `Vec` (`visit_byte_buf`), which postcard never does. So
//! the receiver scatters the string straight into a `Vec` of its own (the
//! kernel's copy, or the copy out of a shared-memory region, is the only
//! one), and deserializes through [`Wrap`], an adapter over postcard's
//! deserializer that gives that `Vec` away when the field asks for it.
//!
//! Where the string sits is predicted from the previous message (a stream of
//! one message type repeats its layout). The rest of the message is read as
//! two slices with a gap between them; a read that reaches into the gap means
//! the prediction was wrong, and the message is deserialized again from one
//! contiguous copy ([`deserialize`] does that itself). A first pass may have
//! had side effects only through channel ends (descriptor indices), so
//! messages that carry descriptors are never split.
//!
//! No `unsafe`: the detached string is never lent out as a slice, only moved.
//!
//! # Limits
//! The adapter is also where decoding is bounded, since every nested value
//! passes through it: a depth limit (each struct, enum, option, sequence or
//! map within another is a level) and an allocation budget (each sequence
//! and map element is charged its in-memory size as the collection would
//! grow to hold it, each string its length). postcard has neither, and
//! trusts the element counts it reads. A limit that trips records its
//! [`WireError`] ([`fault`]), which the message's [`SerDeError`] then
//! carries: postcard's own custom errors keep no message.

use std::cell::{Cell, RefCell};

use postcard::de_flavors::Flavor;
use serde::de::{self, DeserializeOwned, DeserializeSeed, Deserializer, Visitor};

use super::bytes_seq;
use super::config::DecodeLimits;
use super::err::{SerDeError, WireError};

thread_local! {
    /// The first fault a limit or a descriptor check found in the message
    /// being decoded (see [`fault`]).
    static FAULT: Cell<Option<WireError>> = const { Cell::new(None) };
}

/// Records `fault` as the cause of the decoding error about to be returned
/// (the first recorded wins: the errors that unwind after it are its
/// consequences), and returns that error.
pub(crate) fn fault<E: de::Error>(fault: WireError) -> E {
    let _ = FAULT.try_with(|f| {
        if f.get().is_none() {
            f.set(Some(fault));
        }
    });
    E::custom(fault)
}

/// A byte string at least this long is worth receiving into its own buffer
/// (it matches `handles::DIRECT_MIN`, what a sender sends from the caller's
/// memory).
pub(crate) const SPLIT_MIN: usize = 2048;

/// Where a message's first large byte string sits: `at` bytes of the
/// payload come before its contents, which are `len` bytes long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub at: usize,
    pub len: usize,
}

/// A received payload: `head`, then the string (if it was split off), then
/// `tail`.
pub(crate) struct Parts<'a> {
    pub head: &'a [u8],
    pub string: Option<Vec<u8>>,
    pub tail: &'a [u8],
}

/// Deserializes a `T` from `parts`, handing the detached string to the field
/// that asks for it, within `limits`. Sets `seen` to the layout of the first
/// large byte string met, to predict the next message's.
#[inline]
pub(crate) fn deserialize<T: DeserializeOwned>(
    parts: Parts<'_>,
    seen: &Cell<Option<Layout>>,
    limits: DecodeLimits,
) -> Result<T, SerDeError> {
    // A fault left by a decode whose error a `Deserialize` impl caught must
    // not name this one's.
    let _ = FAULT.try_with(|f| f.set(None));
    let Parts { head, string, tail } = parts;
    let (result, string) = decode(head, string, tail, seen, limits);
    match (result, string) {
        (Ok(value), _) => Ok(value),
        // The string was split off and no field took it: the prediction was
        // wrong (or the message is malformed, which the next pass reports).
        (Err(_), Some(string)) => deserialize_whole(head, string, tail, seen, limits),
        (Err(e), None) => Err(with_fault(e)),
    }
}

/// Puts a split-off string back where it was and deserializes the payload
/// as one buffer, with a fresh budget and no fault.
#[cold]
#[inline(never)]
fn deserialize_whole<T: DeserializeOwned>(
    head: &[u8],
    string: Vec<u8>,
    tail: &[u8],
    seen: &Cell<Option<Layout>>,
    limits: DecodeLimits,
) -> Result<T, SerDeError> {
    let len = head.len() + string.len() + tail.len();
    let mut whole = Vec::new();
    if whole.try_reserve_exact(len).is_err() {
        let requested = len as u64;
        return Err(WireError::OutOfMemory { requested }.into());
    }
    whole.extend_from_slice(head);
    whole.extend_from_slice(&string);
    whole.extend_from_slice(tail);
    drop(string);
    let _ = FAULT.try_with(|f| f.set(None));
    decode(&whole, None, &[], seen, limits)
        .0
        .map_err(with_fault)
}

/// The error of a failed decode: the fault recorded, if any, else postcard's.
#[cold]
fn with_fault(e: postcard::Error) -> SerDeError {
    match FAULT.try_with(Cell::take).ok().flatten() {
        Some(fault) => fault.into(),
        None => e.into(),
    }
}

/// One pass over `head`, the string (split off, if given), and `tail`;
/// gives the string back if no field took it.
#[inline]
fn decode<T: DeserializeOwned>(
    head: &[u8],
    string: Option<Vec<u8>>,
    tail: &[u8],
    seen: &Cell<Option<Layout>>,
    limits: DecodeLimits,
) -> (Result<T, postcard::Error>, Option<Vec<u8>>) {
    let state = State {
        head,
        tail,
        pos: Cell::new(0),
        split: string.as_ref().map(|s| Layout {
            at: head.len(),
            len: s.len(),
        }),
        string: RefCell::new(string),
        seen: Cell::new(None),
        depth: Cell::new(limits.depth),
        max_depth: limits.depth,
        budget: Cell::new(limits.budget),
        max_budget: limits.budget,
    };
    let result = if state.split.is_some() {
        let mut postcard = postcard::Deserializer::from_flavor(Input { state: &state });
        T::deserialize(Wrap {
            inner: &mut postcard,
            state: &state,
        })
    } else {
        // One contiguous buffer: postcard's own input, which is cheaper
        // per read than `Input`'s bookkeeping.
        let mut postcard = postcard::Deserializer::from_bytes(head);
        T::deserialize(Wrap {
            inner: &mut postcard,
            state: &state,
        })
    };
    if result.is_ok() {
        seen.set(state.seen.get());
    }
    (result, state.string.take())
}

/// What the input and the adapter share.
struct State<'p> {
    head: &'p [u8],
    tail: &'p [u8],
    /// The input's position in the payload (the gap counted).
    pos: Cell<usize>,
    /// Where the detached string sits, if it was split off.
    split: Option<Layout>,
    /// The detached string, until a field takes it.
    string: RefCell<Option<Vec<u8>>>,
    /// The first large byte string met.
    seen: Cell<Option<Layout>>,
    /// Levels of nesting left, and the limit they started from.
    depth: Cell<u32>,
    max_depth: u32,
    /// Bytes decoding may still allocate, and the budget it started with.
    budget: Cell<u64>,
    max_budget: u64,
}

impl State<'_> {
    /// Goes one level deeper, if the depth limit allows.
    #[inline]
    fn enter<E: de::Error>(&self) -> Result<(), E> {
        match self.depth.get().checked_sub(1) {
            Some(left) => {
                self.depth.set(left);
                Ok(())
            }
            None => Err(fault(WireError::TooDeep {
                limit: self.max_depth,
            })),
        }
    }

    #[inline]
    fn leave(&self) {
        self.depth.set(self.depth.get() + 1);
    }

    /// Takes `bytes` from the budget, if there are that many left.
    #[inline]
    fn charge<E: de::Error>(&self, bytes: u64) -> Result<(), E> {
        match self.budget.get().checked_sub(bytes) {
            Some(left) => {
                self.budget.set(left);
                Ok(())
            }
            None => Err(fault(WireError::DecodeBudget {
                limit: self.max_budget,
            })),
        }
    }
}

/// postcard's input: `head`, a gap the size of the detached string, `tail`.
/// A read into the gap fails (the string is only ever moved, never lent).
struct Input<'de> {
    state: &'de State<'de>,
}

impl<'de> Input<'de> {
    fn take(&mut self, n: usize) -> postcard::Result<&'de [u8]> {
        let State {
            head, tail, pos, ..
        } = self.state;
        let at = pos.get();
        let end = at
            .checked_add(n)
            .ok_or(postcard::Error::DeserializeUnexpectedEnd)?;
        let tail_at = head.len() + self.state.split.map_or(0, |s| s.len);
        let bytes = if end <= head.len() {
            &head[at..end]
        } else if at >= tail_at {
            tail.get(at - tail_at..end - tail_at)
                .ok_or(postcard::Error::DeserializeUnexpectedEnd)?
        } else {
            return Err(postcard::Error::DeserializeUnexpectedEnd);
        };
        pos.set(end);
        Ok(bytes)
    }
}

impl<'de> Flavor<'de> for Input<'de> {
    type Remainder = ();
    type Source = ();

    fn pop(&mut self) -> postcard::Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn size_hint(&self) -> Option<usize> {
        let s = self.state;
        let total = s.head.len() + s.split.map_or(0, |s| s.len) + s.tail.len();
        Some(total.saturating_sub(s.pos.get()))
    }

    fn try_take_n(&mut self, ct: usize) -> postcard::Result<&'de [u8]> {
        self.take(ct)
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Reads a postcard varint (a length) at the start of `bytes`: its value and
/// how many bytes encode it.
fn varint(bytes: &[u8]) -> Option<(usize, usize)> {
    let mut value: u64 = 0;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f).checked_shl(7 * i as u32)?;
        if b & 0x80 == 0 {
            return Some((usize::try_from(value).ok()?, i + 1));
        }
    }
    None
}

/// The adapter. Wrapping the deserializer alone would not do: postcard hands
/// the nested deserializers to visitors, seeds and accessors, so each of
/// those is wrapped too, and every nested value goes through
/// [`Wrap::deserialize_byte_buf`].
struct Wrap<'a, 'p, T> {
    inner: T,
    state: &'a State<'p>,
}

impl<'a, 'p, T> Wrap<'a, 'p, T> {
    fn wrap<U>(&self, inner: U) -> Wrap<'a, 'p, U> {
        Wrap {
            inner,
            state: self.state,
        }
    }
}

macro_rules! forward_deserialize {
    ($($method:ident $(($($arg:ident: $ty:ty),*))?;)*) => {$(
        fn $method<V: Visitor<'de>>(
            self,
            $($($arg: $ty,)*)?
            visitor: V,
        ) -> Result<V::Value, D::Error> {
            let visitor = self.wrap(visitor);
            self.inner.$method($($($arg,)*)? visitor)
        }
    )*};
}

/// As `forward_deserialize`, for the values that hold others: one level
/// deeper while they are read.
macro_rules! forward_nested {
    ($($method:ident $(($($arg:ident: $ty:ty),*))?;)*) => {$(
        fn $method<V: Visitor<'de>>(
            self,
            $($($arg: $ty,)*)?
            visitor: V,
        ) -> Result<V::Value, D::Error> {
            let state = self.state;
            state.enter()?;
            let visitor = self.wrap(visitor);
            let value = self.inner.$method($($($arg,)*)? visitor);
            state.leave();
            value
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Wrap<'_, '_, D> {
    type Error = D::Error;

    forward_deserialize! {
        deserialize_any; deserialize_bool; deserialize_i8; deserialize_i16; deserialize_i32;
        deserialize_i64; deserialize_i128; deserialize_u8; deserialize_u16; deserialize_u32;
        deserialize_u64; deserialize_u128; deserialize_f32; deserialize_f64; deserialize_char;
        deserialize_str; deserialize_string; deserialize_bytes;
        deserialize_unit; deserialize_identifier;
        deserialize_ignored_any;
        deserialize_unit_struct(name: &'static str);
    }

    forward_nested! {
        deserialize_option;
        deserialize_newtype_struct(name: &'static str);
        deserialize_tuple(len: usize);
        deserialize_tuple_struct(name: &'static str, len: usize);
        deserialize_struct(name: &'static str, fields: &'static [&'static str]);
        deserialize_enum(name: &'static str, variants: &'static [&'static str]);
    }

    /// serde's `Vec<u8>` as the byte string it is on the wire (see
    /// `ipc::bytes_seq`); any other sequence element by element.
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        if bytes_seq::is_vec_u8_visitor::<V>() {
            let bytes = self.deserialize_byte_buf(bytes_seq::ByteVec)?;
            return Ok(bytes_seq::into_value::<V>(bytes));
        }
        let state = self.state;
        state.enter()?;
        let visitor = Collection {
            inner: visitor,
            state,
        };
        let value = self.inner.deserialize_seq(visitor);
        state.leave();
        value
    }

    /// A map, its entries charged as they are read ([`Elements`]).
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        let state = self.state;
        state.enter()?;
        let visitor = Collection {
            inner: visitor,
            state,
        };
        let value = self.inner.deserialize_map(visitor);
        state.leave();
        value
    }

    /// The detached string if this is where it sits; notes where the first
    /// large byte string was, either way.
    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        let state = self.state;
        if state.split.is_none() {
            // Contiguous: postcard's input keeps the position, so find the
            // string by where the slice it hands the visitor points.
            let visitor = Learn {
                inner: self.wrap(visitor),
                state,
            };
            return self.inner.deserialize_byte_buf(visitor);
        }
        let pos = state.pos.get();
        if let Some((len, n)) = state.head.get(pos..).and_then(varint) {
            let here = Layout { at: pos + n, len };
            if state.split == Some(here) {
                if let Some(string) = state.string.borrow_mut().take() {
                    state.pos.set(here.at + here.len);
                    state.seen.set(state.seen.get().or(Some(here)));
                    return visitor.visit_byte_buf(string);
                }
            }
            if len >= SPLIT_MIN && state.seen.get().is_none() {
                state.seen.set(Some(here));
            }
        }
        let visitor = self.wrap(visitor);
        self.inner.deserialize_byte_buf(visitor)
    }

    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

/// A byte string's visitor on the contiguous path: notes where the string
/// sits in the payload, then visits.
struct Learn<'a, 'p, V> {
    inner: V,
    state: &'a State<'p>,
}

impl<V> Learn<'_, '_, V> {
    fn note(&self, bytes: &[u8]) {
        let state = self.state;
        // Address arithmetic only: no pointer is formed from it.
        let at = (bytes.as_ptr() as usize).wrapping_sub(state.head.as_ptr() as usize);
        if bytes.len() >= SPLIT_MIN
            && state.seen.get().is_none()
            && at
                .checked_add(bytes.len())
                .is_some_and(|end| end <= state.head.len())
        {
            state.seen.set(Some(Layout {
                at,
                len: bytes.len(),
            }));
        }
    }
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Learn<'_, '_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.expecting(f)
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Self::Value, E> {
        self.note(v);
        self.inner.visit_bytes(v)
    }

    fn visit_borrowed_bytes<E: de::Error>(self, v: &'de [u8]) -> Result<Self::Value, E> {
        self.note(v);
        self.inner.visit_borrowed_bytes(v)
    }
}

macro_rules! forward_visit {
    ($($method:ident($ty:ty);)*) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<Self::Value, E> {
            self.inner.$method(v)
        }
    )*};
}

macro_rules! charge_visit {
    ($($method:ident($ty:ty);)*) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<Self::Value, E> {
            self.state.charge(v.len() as u64)?;
            self.inner.$method(v)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Wrap<'_, '_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.expecting(f)
    }

    forward_visit! {
        visit_bool(bool); visit_i8(i8); visit_i16(i16); visit_i32(i32); visit_i64(i64);
        visit_i128(i128); visit_u8(u8); visit_u16(u16); visit_u32(u32); visit_u64(u64);
        visit_u128(u128); visit_f32(f32); visit_f64(f64); visit_char(char);
        visit_string(String); visit_byte_buf(Vec<u8>);
    }

    // A borrowed string becomes an owned one (the message is
    // `DeserializeOwned`): charged its length. (An owned one was allocated
    // by the receive, within the message's size.)
    charge_visit! {
        visit_str(&str); visit_borrowed_str(&'de str);
        visit_bytes(&[u8]); visit_borrowed_bytes(&'de [u8]);
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.inner.visit_none()
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.inner.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        let d = self.wrap(d);
        self.inner.visit_some(d)
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        let d = self.wrap(d);
        self.inner.visit_newtype_struct(d)
    }

    /// A struct's or a tuple's fields (a sequence's come through
    /// [`Collection`]).
    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        let seq = self.wrap(seq);
        self.inner.visit_seq(seq)
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let map = Elements::new(map, self.state);
        self.inner.visit_map(map)
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        let data = self.wrap(data);
        self.inner.visit_enum(data)
    }
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Wrap<'_, '_, S> {
    type Value = S::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        let d = self.wrap(d);
        self.inner.deserialize(d)
    }
}

/// The visitor of a sequence or a map (postcard visits structs and tuples
/// as sequences too, whose fields are no allocation of their own): its
/// elements are charged ([`Elements`]).
struct Collection<'a, 'p, V> {
    inner: V,
    state: &'a State<'p>,
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Collection<'_, '_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.expecting(f)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        let seq = Elements::new(seq, self.state);
        self.inner.visit_seq(seq)
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        let map = Elements::new(map, self.state);
        self.inner.visit_map(map)
    }
}

/// A sequence's or a map's elements, each charged to the budget before it
/// is read, as the collection that receives them would grow: serde's
/// collections reserve what the sequence's length hint says (up to 1 MiB,
/// its `size_hint::cautious`), then double. So the charge runs ahead of the
/// allocation, and a collection stops growing before it overdraws. Each
/// element costs at least a byte, so a claimed length of zero-sized
/// elements (`HashSet<()>` with 2^60 of them, ten bytes on the wire) runs
/// out of budget instead of spinning for ages.
struct Elements<'a, 'p, A> {
    inner: A,
    state: &'a State<'p>,
    /// The keys (or a sequence's elements), and a map's values.
    keys: Growth,
    values: Growth,
}

/// How far a collection's storage has been charged for.
#[derive(Default)]
struct Growth {
    /// Elements read.
    len: usize,
    /// Elements the charged storage holds.
    capacity: usize,
}

/// What serde's collections reserve up front at most (`size_hint::cautious`).
const PREALLOCATED: usize = 1 << 20;

impl Growth {
    /// Charges room for one more element of `size` bytes, given the
    /// sequence's length `hint`.
    #[inline]
    fn charge<E: de::Error>(
        &mut self,
        size: usize,
        hint: Option<usize>,
        state: &State<'_>,
    ) -> Result<(), E> {
        let size = size.max(1);
        if self.len == self.capacity {
            let capacity = match self.capacity {
                0 => hint.unwrap_or(0).min(PREALLOCATED / size).max(1),
                n => n.saturating_mul(2),
            };
            let more = (capacity - self.capacity) as u64;
            state.charge(more.saturating_mul(size as u64))?;
            self.capacity = capacity;
        }
        self.len += 1;
        Ok(())
    }
}

impl<'a, 'p, A> Elements<'a, 'p, A> {
    fn new(inner: A, state: &'a State<'p>) -> Self {
        Elements {
            inner,
            state,
            keys: Growth::default(),
            values: Growth::default(),
        }
    }

    fn wrap<U>(&self, inner: U) -> Wrap<'a, 'p, U> {
        Wrap {
            inner,
            state: self.state,
        }
    }
}

impl<'de, A: de::SeqAccess<'de>> de::SeqAccess<'de> for Elements<'_, '_, A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        if self.inner.size_hint() == Some(0) {
            return Ok(None);
        }
        let hint = self.inner.size_hint();
        (self.keys).charge(size_of::<T::Value>(), hint, self.state)?;
        let seed = self.wrap(seed);
        self.inner.next_element_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, A: de::SeqAccess<'de>> de::SeqAccess<'de> for Wrap<'_, '_, A> {
    type Error = A::Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, A::Error> {
        let seed = self.wrap(seed);
        self.inner.next_element_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, A: de::MapAccess<'de>> de::MapAccess<'de> for Elements<'_, '_, A> {
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        if self.inner.size_hint() == Some(0) {
            return Ok(None);
        }
        let hint = self.inner.size_hint();
        (self.keys).charge(size_of::<K::Value>(), hint, self.state)?;
        let seed = self.wrap(seed);
        self.inner.next_key_seed(seed)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        // (Used for the first value only, when the hint counts the entries
        // after this one.)
        let hint = self.inner.size_hint().map(|left| left + 1);
        (self.values).charge(size_of::<V::Value>(), hint, self.state)?;
        let seed = self.wrap(seed);
        self.inner.next_value_seed(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, 'a, 'p, A: de::EnumAccess<'de>> de::EnumAccess<'de> for Wrap<'a, 'p, A> {
    type Error = A::Error;
    type Variant = Wrap<'a, 'p, A::Variant>;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Self::Variant), A::Error> {
        let seed = self.wrap(seed);
        let state = self.state;
        let (value, variant) = self.inner.variant_seed(seed)?;
        Ok((
            value,
            Wrap {
                inner: variant,
                state,
            },
        ))
    }
}

impl<'de, A: de::VariantAccess<'de>> de::VariantAccess<'de> for Wrap<'_, '_, A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        self.inner.unit_variant()
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        let seed = self.wrap(seed);
        self.inner.newtype_variant_seed(seed)
    }

    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        let visitor = self.wrap(visitor);
        self.inner.tuple_variant(len, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        let visitor = self.wrap(visitor);
        self.inner.struct_variant(fields, visitor)
    }
}

#[cfg(test)]
mod tests;
