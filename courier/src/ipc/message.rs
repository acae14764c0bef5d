//! Untyped messages and ends whose message type was erased: what a receiver
//! set hands out, and what travels where the type is not known.

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::mem;
use std::os::fd::OwnedFd;

use serde::{Deserialize, Serialize};

use super::split::Parts;
use super::transport::{OsReceiver, OsSender, Wait};
use super::{handles, Config, IpcError, IpcReceiver, IpcSender, SerDeError};

/// A received message not yet deserialized: bytes plus the channel
/// descriptors that came with it.
pub struct IpcMessage {
    pub(super) data: Vec<u8>,
    pub(super) channels: Vec<OwnedFd>,
    /// The size limit of the receiver it came from, which also bounds the
    /// shared memory it may bring (`None`: the process's).
    pub(super) limit: Option<u64>,
}

impl IpcMessage {
    /// A message of `data` with no channels.
    pub fn from_data(data: Vec<u8>) -> Self {
        IpcMessage {
            data,
            channels: Vec::new(),
            limit: None,
        }
    }

    /// The message's encoded bytes.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Deserializes the message; descriptors no channel end claims are closed.
    pub fn to<T>(self) -> Result<T, SerDeError>
    where
        T: for<'de> Deserialize<'de> + Serialize,
    {
        let parts = Parts {
            head: &self.data,
            string: None,
            tail: &[],
        };
        let limit = self.limit.unwrap_or_else(Config::max_message_size_now);
        handles::deserialize_message(parts, self.channels, &Cell::new(None), limit)
    }

    /// [`to`](Self::to), leaving the bytes in place (the descriptors go to
    /// the value), so that the buffer can receive the next message.
    pub(crate) fn decode_in_place<T>(&mut self) -> Result<T, SerDeError>
    where
        T: for<'de> Deserialize<'de> + Serialize,
    {
        let parts = Parts {
            head: &self.data,
            string: None,
            tail: &[],
        };
        let limit = self.limit.unwrap_or_else(Config::max_message_size_now);
        let channels = mem::take(&mut self.channels);
        handles::deserialize_message(parts, channels, &Cell::new(None), limit)
    }
}

impl fmt::Debug for IpcMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcMessage")
            .field("data", &&self.data[..self.data.len().min(256)])
            .field("channels", &self.channels.len())
            .finish()
    }
}

/// An [`IpcSender`] whose message type was erased.
#[derive(Clone)]
pub struct OpaqueIpcSender {
    pub(super) os: OsSender,
}

impl OpaqueIpcSender {
    /// Gives the sender a message type back.
    pub fn to<'de, T>(self) -> IpcSender<T>
    where
        T: Deserialize<'de> + Serialize,
    {
        IpcSender::from_os(self.os)
    }
}

impl fmt::Debug for OpaqueIpcSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpaqueIpcSender")
            .field("fd", &self.os.fd())
            .finish()
    }
}

/// An [`IpcReceiver`] whose message type was erased.
pub struct OpaqueIpcReceiver {
    pub(super) os: OsReceiver,
}

impl OpaqueIpcReceiver {
    /// Gives the receiver a message type back.
    pub fn to<'de, T>(self) -> IpcReceiver<T>
    where
        T: Deserialize<'de> + Serialize,
    {
        IpcReceiver {
            os: self.os,
            limit: Cell::new(None),
            layout: Cell::new(None),
            _type: PhantomData,
        }
    }

    /// Receives the next message without deserializing it.
    pub fn recv(&self) -> Result<IpcMessage, IpcError> {
        let limit = Config::max_message_size_now();
        let mut data = Vec::new();
        let channels = self.os.recv_into(&mut data, Wait::Block, limit)?;
        Ok(IpcMessage {
            data,
            channels,
            limit: Some(limit),
        })
    }
}

impl fmt::Debug for OpaqueIpcReceiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpaqueIpcReceiver")
            .field("fd", &self.os.fd())
            .finish()
    }
}
