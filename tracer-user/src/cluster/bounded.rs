//! Sequences decoded with a bound on how many elements are kept: what a peer's frame can make us
//! allocate.
//!
//! A frame's bytes bound each element's cost on the wire, not in memory: an empty string is one
//! byte on the wire and a 24-byte `String` (plus its slot in the vector) here, so 8 MiB of them
//! decode into hundreds of megabytes. [`keep_at_most`] keeps the first `n` elements and decodes
//! the rest one at a time, dropping each at once (postcard is not self-describing: an element can
//! only be skipped by decoding it). The caller refuses a sequence that reached `n`, so nothing is
//! ever silently cut: give it one more than the bound it enforces.

use std::{fmt, marker::PhantomData};

use serde::{
    Deserialize, Deserializer,
    de::{SeqAccess, Visitor},
};

/// Decodes a sequence, keeping at most `n` of its elements (see the module's note).
pub fn keep_at_most<'de, D, T>(deserializer: D, n: usize) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct KeepAtMost<T> {
        n: usize,
        element: PhantomData<T>,
    }

    impl<'de, T: Deserialize<'de>> Visitor<'de> for KeepAtMost<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "a sequence (of which at most {} elements are kept)", self.n)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            // The announced length is the peer's word: never allocate on it beyond the bound.
            let mut kept = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(self.n).min(1024));
            while let Some(element) = seq.next_element::<T>()? {
                if kept.len() < self.n {
                    kept.push(element);
                }
            }
            Ok(kept)
        }
    }

    deserializer.deserialize_seq(KeepAtMost { n, element: PhantomData })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct Names {
        #[serde(deserialize_with = "three")]
        names: Vec<String>,
        after: u32,
    }

    fn three<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
        keep_at_most(d, 3)
    }

    use serde::Serialize;

    #[test]
    fn keeps_the_first_elements_and_reads_past_the_rest() {
        let sent = Names { names: (0..100_000).map(|_| String::new()).collect(), after: 7 };
        let bytes = postcard::to_stdvec(&sent).unwrap();
        let got: Names = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(got, Names { names: vec![String::new(); 3], after: 7 });
        let few = Names { names: vec!["a".into(), "b".into()], after: 1 };
        assert_eq!(postcard::from_bytes::<Names>(&postcard::to_stdvec(&few).unwrap()).unwrap(), few);
    }
}
