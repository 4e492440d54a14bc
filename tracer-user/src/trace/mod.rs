//! A recorded trace, as it is read back: [`read`].

pub mod read;
