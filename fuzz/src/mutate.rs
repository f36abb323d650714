//! The mutations that turn one input into the next: AFL-style byte edits (bit flips, interesting
//! integers, arithmetic, chunks deleted, inserted, duplicated, spliced between inputs), dictionary
//! tokens, and for text formats edits that keep the text a format (numbers replaced by huge or
//! negative ones, lines dropped or repeated) and for JSON edits of its tree (keys dropped or
//! duplicated, values of another type, arrays emptied or grown, shapes like `[1000000000000]`).

use serde_json::Value;

use crate::rng::Rng;

/// What an input is, beyond its bytes: which structure-aware mutations apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grammar {
    /// Bytes only.
    Binary,
    /// Text: numbers and lines besides bytes.
    Text,
    /// JSON: its tree besides text and bytes.
    Json,
}

const INTERESTING_8: [u8; 9] = [0x80, 0xff, 0, 1, 16, 32, 64, 100, 127];
const INTERESTING_16: [u16; 10] = [0x8000, 0xff7f, 128, 255, 256, 512, 1000, 1024, 4096, 0x7fff];
const INTERESTING_32: [u32; 8] = [
    0x8000_0000,
    0xfa00_00fa,
    0xffff_7fff,
    32768,
    65535,
    65536,
    0x7fff_ffff,
    0xffff_ffff,
];
const INTERESTING_64: [u64; 8] = [
    0x8000_0000_0000_0000,
    0x7fff_ffff_ffff_ffff,
    0xffff_ffff_ffff_ffff,
    1 << 32,
    1 << 40,
    1_000_000_000_000,
    0xffff_ffff_ffff_fff8,
    1 << 62,
];

/// Numbers as text that break parsers: past every integer width, negative, not finite.
pub const INTERESTING_NUMBERS: [&str; 22] = [
    "0",
    "-1",
    "1",
    "-0",
    "2147483648",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775807",
    "-9223372036854775808",
    "1000000000000",
    "1e308",
    "-1e308",
    "1e400",
    "1e-320",
    "NaN",
    "inf",
    "-inf",
    "0.5",
    "65535",
    "99999999999999999999999999999",
    "3.5e38",
];

/// A marker key the JSON mutations rename to an existing key after serializing, to write an
/// object with a key twice (a tree cannot hold that).
const DUP_MARKER: &str = "__kiln_fuzz_duplicate_key__";

/// Mutates inputs of one target.
#[derive(Debug)]
pub struct Mutator {
    rng: Rng,
    grammar: Grammar,
    dictionary: Vec<Vec<u8>>,
    max_len: usize,
}

impl Mutator {
    /// A mutator drawing from `rng`; `dictionary` holds tokens of the format (keys, magic
    /// numbers, type names); no output is longer than `max_len`.
    pub fn new(rng: Rng, grammar: Grammar, dictionary: &[&[u8]], max_len: usize) -> Self {
        Self {
            rng,
            grammar,
            dictionary: dictionary.iter().map(|t| t.to_vec()).collect(),
            max_len,
        }
    }

    /// The generator, for choices the caller makes (which input to mutate).
    pub fn rng(&mut self) -> &mut Rng {
        &mut self.rng
    }

    /// A mutation of `base`; `corpus` gives the inputs it may splice with.
    pub fn mutate(&mut self, base: &[u8], corpus: &[Vec<u8>]) -> Vec<u8> {
        let mut out = base.to_vec();
        let structured = match self.grammar {
            Grammar::Json if self.rng.one_in(2) => self.json(&out),
            Grammar::Json | Grammar::Text if self.rng.one_in(2) => self.text(&out),
            _ => None,
        };
        let structured = structured.filter(|s| s.as_slice() != base);
        let byte_edits = match structured {
            Some(mutated) => {
                out = mutated;
                // Most structured mutations stay as they are: bytes on top break them again.
                usize::from(self.rng.one_in(4))
            }
            None => 1 << self.rng.below(4),
        };
        for _ in 0..byte_edits {
            self.byte_edit(&mut out, corpus);
        }
        out.truncate(self.max_len);
        out
    }

    fn token(&mut self) -> Vec<u8> {
        if self.dictionary.is_empty() || self.rng.one_in(4) {
            return self.rng.pick(&INTERESTING_NUMBERS).as_bytes().to_vec();
        }
        self.rng.pick(&self.dictionary).clone()
    }

    /// A token as the text of a JSON string or key (without the quotes a JSON token has).
    fn token_text(&mut self) -> String {
        let token = String::from_utf8_lossy(&self.token()).into_owned();
        match token.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
            Some(inner) => inner.to_owned(),
            None => token,
        }
    }

    /// One AFL-style edit of the bytes.
    fn byte_edit(&mut self, out: &mut Vec<u8>, corpus: &[Vec<u8>]) {
        if out.is_empty() {
            let token = self.token();
            out.extend_from_slice(&token);
            return;
        }
        let at = self.rng.below(out.len());
        match self.rng.below(13) {
            0 => out[at] ^= 1 << self.rng.below(8),
            1 => out[at] = self.rng.next_u64() as u8,
            2 => self.interesting(out, at),
            3 => self.arithmetic(out, at),
            4 => {
                let (start, len) = self.rng.range(out.len());
                out.drain(start..start + len);
            }
            5 => {
                let bytes: Vec<u8> = if self.rng.one_in(2) {
                    let n = 1 + self.rng.below(16);
                    (0..n).map(|_| self.rng.next_u64() as u8).collect()
                } else {
                    vec![self.rng.next_u64() as u8; 1 + self.rng.below(128)]
                };
                out.splice(at..at, bytes);
            }
            6 => {
                let (start, len) = self.rng.range(out.len());
                let chunk = out[start..start + len].to_vec();
                let to = self.rng.below(out.len() + 1);
                out.splice(to..to, chunk);
            }
            7 => {
                let (start, len) = self.rng.range(out.len());
                let chunk = out[start..start + len].to_vec();
                let to = self.rng.below(out.len() - len + 1);
                out[to..to + len].copy_from_slice(&chunk);
            }
            8 => self.splice(out, corpus),
            9 => {
                let token = self.token();
                out.splice(at..at, token);
            }
            10 => {
                let token = self.token();
                let end = (at + token.len()).min(out.len());
                out.splice(at..end, token);
            }
            11 => out.truncate(at),
            _ => {
                let other = self.rng.pick(corpus);
                if !other.is_empty() {
                    let (start, len) = self.rng.range(other.len());
                    out.splice(at..at, other[start..start + len].iter().copied());
                }
            }
        }
    }

    /// Overwrites the bytes at `at` with an interesting integer of a random width and order.
    fn interesting(&mut self, out: &mut [u8], at: usize) {
        let big_endian = self.rng.one_in(2);
        let bytes: Vec<u8> = match self.rng.below(4) {
            0 => vec![*self.rng.pick(&INTERESTING_8)],
            1 => order(&self.rng.pick(&INTERESTING_16).to_le_bytes(), big_endian),
            2 => order(&self.rng.pick(&INTERESTING_32).to_le_bytes(), big_endian),
            _ => order(&self.rng.pick(&INTERESTING_64).to_le_bytes(), big_endian),
        };
        let end = (at + bytes.len()).min(out.len());
        out[at..end].copy_from_slice(&bytes[..end - at]);
    }

    /// Adds or subtracts a small number to the little-endian integer at `at`.
    fn arithmetic(&mut self, out: &mut [u8], at: usize) {
        let width = 1 << self.rng.below(4);
        let end = (at + width).min(out.len());
        let mut word = [0u8; 8];
        word[..end - at].copy_from_slice(&out[at..end]);
        let delta = 1 + self.rng.below(35) as u64;
        let value = u64::from_le_bytes(word);
        let value = if self.rng.one_in(2) {
            value.wrapping_add(delta)
        } else {
            value.wrapping_sub(delta)
        };
        out[at..end].copy_from_slice(&value.to_le_bytes()[..end - at]);
    }

    /// Replaces `out` by a prefix of it and a suffix of another input.
    fn splice(&mut self, out: &mut Vec<u8>, corpus: &[Vec<u8>]) {
        let other = self.rng.pick(corpus);
        let cut = self.rng.below(out.len() + 1);
        let from = self.rng.below(other.len() + 1);
        out.truncate(cut);
        out.extend_from_slice(&other[from..]);
    }

    /// An edit of the text in the input (which may hold binary parts too): a number, a token
    /// or a line.
    fn text(&mut self, input: &[u8]) -> Option<Vec<u8>> {
        match self.rng.below(5) {
            0 => self.replace_number(input),
            1 => self.replace_token(input),
            2 | 3 => self.edit_lines(input),
            _ => {
                let token = self.token();
                let at = self.rng.below(input.len() + 1);
                Some(replaced(input, (at, at), &token))
            }
        }
    }

    /// A run of digits (with its sign and fraction) replaced by an interesting number.
    fn replace_number(&mut self, input: &[u8]) -> Option<Vec<u8>> {
        let numbers = number_spans(input);
        if numbers.is_empty() {
            return None;
        }
        let span = *self.rng.pick(&numbers);
        let with = *self.rng.pick(&INTERESTING_NUMBERS);
        Some(replaced(input, span, with.as_bytes()))
    }

    /// One of the dictionary's tokens found in the input replaced by another.
    fn replace_token(&mut self, input: &[u8]) -> Option<Vec<u8>> {
        // A window of the input, so that a large one costs no more than a small one.
        let from = self.rng.below(input.len().saturating_sub(4096) + 1);
        let to = (from + 4096).min(input.len());
        let found: Vec<(usize, usize)> = self
            .dictionary
            .iter()
            .filter(|t| !t.is_empty())
            .flat_map(|t| {
                (from..=to.saturating_sub(t.len()))
                    .filter(|&i| input[i..].starts_with(t))
                    .map(|i| (i, i + t.len()))
            })
            .collect();
        if found.is_empty() {
            return None;
        }
        let span = *self.rng.pick(&found);
        let with = self.token();
        Some(replaced(input, span, &with))
    }

    /// A line dropped, repeated (up to many times) or moved.
    fn edit_lines(&mut self, input: &[u8]) -> Option<Vec<u8>> {
        let mut lines: Vec<&[u8]> = input.split_inclusive(|&b| b == b'\n').collect();
        if lines.len() < 2 {
            return None;
        }
        let k = self.rng.below(lines.len());
        match self.rng.below(3) {
            0 => {
                lines.remove(k);
            }
            1 => {
                let times = if self.rng.one_in(8) {
                    1 + self.rng.below(2000)
                } else {
                    1
                };
                let line = lines[k];
                lines.splice(k..k, std::iter::repeat_n(line, times));
            }
            _ => {
                let j = self.rng.below(lines.len());
                lines.swap(k, j);
            }
        }
        Some(lines.concat())
    }

    /// An edit of the JSON tree in the input (the whole input, or the first JSON object in
    /// it, as in a safetensors header): one node changed, then written back compact or pretty.
    fn json(&mut self, input: &[u8]) -> Option<Vec<u8>> {
        let (start, end) = json_span(input)?;
        let mut tree: Value = serde_json::from_slice(&input[start..end]).ok()?;
        let nodes = count_nodes(&tree);
        let k = self.rng.below(nodes);
        let mut duplicate = None;
        visit_nth(&mut tree, k, &mut |node| {
            duplicate = self.edit_node(node);
        });
        let text = if self.rng.one_in(2) {
            serde_json::to_string(&tree)
        } else {
            serde_json::to_string_pretty(&tree)
        }
        .ok()?;
        let text = match duplicate {
            Some(key) => text.replace(
                &format!("\"{DUP_MARKER}\""),
                &serde_json::to_string(&key).ok()?,
            ),
            None => text,
        };
        Some(replaced(input, (start, end), text.as_bytes()))
    }

    /// Changes one node; returns the key an object gained a second copy of (under
    /// [`DUP_MARKER`]).
    fn edit_node(&mut self, node: &mut Value) -> Option<String> {
        if self.rng.one_in(4) {
            *node = self.other_value();
            return None;
        }
        match node {
            Value::Number(_) | Value::Null | Value::Bool(_) => *node = self.number(),
            Value::String(s) => {
                *s = match self.rng.below(4) {
                    0 => String::new(),
                    1 => s.repeat(1 + self.rng.below(1000)),
                    _ => self.token_text(),
                }
            }
            Value::Array(items) => self.edit_array(items),
            Value::Object(map) => {
                let keys: Vec<String> = map.keys().cloned().collect();
                if keys.is_empty() {
                    let key = self.token_text();
                    map.insert(key, self.other_value());
                    return None;
                }
                let key = self.rng.pick(&keys).clone();
                match self.rng.below(3) {
                    0 => {
                        map.remove(&key);
                    }
                    1 => {
                        let value = self.other_value();
                        map.insert(DUP_MARKER.to_owned(), value);
                        return Some(key);
                    }
                    _ => {
                        let token = self.token_text();
                        if let Some(value) = map.remove(&key) {
                            map.insert(token, value);
                        }
                    }
                }
            }
        }
        None
    }

    fn edit_array(&mut self, items: &mut Vec<Value>) {
        match self.rng.below(5) {
            0 => items.clear(),
            1 => *items = vec![self.number()],
            2 if !items.is_empty() => {
                let k = self.rng.below(items.len());
                items.remove(k);
            }
            3 if !items.is_empty() => {
                let k = self.rng.below(items.len());
                let most = if self.rng.one_in(4) { 1000 } else { 3 };
                let times = 1 + self.rng.below(most);
                let copy = items[k].clone();
                items.splice(k..k, std::iter::repeat_n(copy, times));
            }
            _ => items.push(self.number()),
        }
    }

    /// A number JSON can hold that breaks what reads it.
    fn number(&mut self) -> Value {
        match self.rng.below(4) {
            0 => Value::from(*self.rng.pick(&INTERESTING_64)),
            1 => Value::from(-(self.rng.below(1 << 20) as i64) - 1),
            2 => Value::from(*self.rng.pick(&[0.5, -0.0, 1e300, -1e300, 1e-310, 3.5e38])),
            _ => Value::from(self.rng.below(70_000) as u64),
        }
    }

    /// A value of any type.
    fn other_value(&mut self) -> Value {
        match self.rng.below(7) {
            0 => Value::Null,
            1 => Value::Bool(self.rng.one_in(2)),
            2 => self.number(),
            3 => Value::String(self.token_text()),
            4 => Value::Array(vec![self.number(); self.rng.below(4)]),
            5 => Value::Object(serde_json::Map::new()),
            _ => {
                let mut deep = self.number();
                for _ in 0..self.rng.below(300) {
                    deep = Value::Array(vec![deep]);
                }
                deep
            }
        }
    }
}

/// `le` (little-endian bytes) in big-endian order when asked.
fn order(le: &[u8], big_endian: bool) -> Vec<u8> {
    let mut bytes = le.to_vec();
    if big_endian {
        bytes.reverse();
    }
    bytes
}

/// `input` with the bytes of `span` replaced by `with`.
fn replaced(input: &[u8], (start, end): (usize, usize), with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len() + with.len());
    out.extend_from_slice(&input[..start]);
    out.extend_from_slice(with);
    out.extend_from_slice(&input[end..]);
    out
}

/// Where the JSON value in `input` is: the whole input, or else the first object that parses
/// from a `{`.
pub fn json_span(input: &[u8]) -> Option<(usize, usize)> {
    if serde_json::from_slice::<Value>(input).is_ok() {
        return Some((0, input.len()));
    }
    let start = input.iter().position(|&b| b == b'{')?;
    let mut values = serde_json::Deserializer::from_slice(&input[start..]).into_iter::<Value>();
    values.next()?.ok()?;
    Some((start, start + values.byte_offset()))
}

/// The byte ranges of the numbers in `bytes`: digits with an optional sign, fraction and
/// exponent.
fn number_spans(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut spans = vec![];
    let mut i = 0;
    while i < bytes.len() {
        if !bytes[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = if i > 0 && bytes[i - 1] == b'-' {
            i - 1
        } else {
            i
        };
        while i < bytes.len() && (bytes[i].is_ascii_digit() || b".eE+-".contains(&bytes[i])) {
            i += 1;
        }
        spans.push((start, i));
    }
    spans
}

fn count_nodes(v: &Value) -> usize {
    1 + match v {
        Value::Array(items) => items.iter().map(count_nodes).sum(),
        Value::Object(map) => map.values().map(count_nodes).sum(),
        _ => 0,
    }
}

/// Calls `f` on the `n`th node of `v` in pre-order; returns how many nodes it passed.
fn visit_nth(v: &mut Value, n: usize, f: &mut dyn FnMut(&mut Value)) -> usize {
    if n == 0 {
        f(v);
        return usize::MAX;
    }
    let mut passed = 1;
    let children: Vec<&mut Value> = match v {
        Value::Array(items) => items.iter_mut().collect(),
        Value::Object(map) => map.values_mut().collect(),
        _ => vec![],
    };
    for child in children {
        let went = visit_nth(child, n - passed, f);
        if went == usize::MAX {
            return usize::MAX;
        }
        passed += went;
    }
    passed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_found_with_their_sign_and_exponent() {
        let text = "a: -12, b: 3.5e-7, (4, 5)";
        let spans: Vec<&str> = number_spans(text.as_bytes())
            .into_iter()
            .map(|(s, e)| &text[s..e])
            .collect();
        assert_eq!(spans, ["-12", "3.5e-7", "4", "5"]);
    }

    #[test]
    fn the_nth_node_is_visited_in_pre_order() {
        let mut v: Value = serde_json::from_str(r#"{"a": [1, 2], "b": {"c": 3}}"#).unwrap();
        assert_eq!(count_nodes(&v), 6);
        let mut seen = vec![];
        for n in 0..6 {
            visit_nth(&mut v, n, &mut |node| seen.push(node.to_string()));
        }
        assert_eq!(seen[1], "[1,2]");
        assert_eq!(seen[3], "2");
        assert_eq!(seen[5], "3");
    }

    #[test]
    fn json_is_found_inside_binary_framing() {
        let mut input = 17u64.to_le_bytes().to_vec();
        input.extend_from_slice(br#"{"a":{"b":[1,2]}}"#);
        input.extend_from_slice(b"\x7d\x00\x7d");
        assert_eq!(json_span(&input), Some((8, 25)));
        assert_eq!(json_span(br#"[1, 2]"#), Some((0, 6)));
        assert_eq!(json_span(b"no json"), None);
    }

    #[test]
    fn a_duplicated_key_is_written_twice() {
        let mut m = Mutator::new(Rng::new(1), Grammar::Json, &[], 1 << 16);
        let input = br#"{"version": 3, "samples": 10}"#;
        let twice = (0..2000).map(|_| m.json(input).unwrap()).any(|out| {
            let text = String::from_utf8(out).unwrap();
            text.matches("\"version\"").count() == 2 || text.matches("\"samples\"").count() == 2
        });
        assert!(twice);
    }
}
