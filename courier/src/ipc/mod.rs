//! Cross-process channels.
