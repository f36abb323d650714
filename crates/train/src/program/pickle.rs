//! A bounded walk over a pickle's opcodes that never executes it: every global the pickle would
//! import (`GLOBAL`, `INST`, and `STACK_GLOBAL` of names written as constants) is handed to the
//! caller's allow-list, and anything that could reach a callable by another road (the extension
//! registry, `STACK_GLOBAL` of computed names, out-of-band buffers) is refused. The stack is
//! modelled only as far as that needs (marks, short strings, anything else), so the walk costs
//! one pass over the bytes and memory bounded by [`MAX_ITEMS`].

use std::collections::HashMap;

/// The most stack and memo entries a pickle may hold at once.
pub const MAX_ITEMS: usize = 1 << 22;
/// The longest string kept as a name (longer ones cannot name a global kiln allows).
const MAX_NAME: usize = 512;
/// The longest protocol-0 text argument.
const MAX_LINE: usize = 1 << 16;

/// Why a pickle is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PickleError {
    /// It imports something outside the allow-list.
    #[error(
        "its pickle imports `{module}.{name}` (byte {offset}), which could run code when loaded"
    )]
    Global {
        module: String,
        name: String,
        offset: usize,
    },
    /// It is not a well-formed pickle, or uses what kiln never accepts.
    #[error("its pickle {why} (byte {offset})")]
    Refused { offset: usize, why: String },
}

/// What the walk knows of a stack entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Item {
    Mark,
    /// A string constant short enough to be a module or attribute name.
    Name(String),
    Other,
}

/// Walks the pickle at the start of `bytes` up to its `STOP`, checking each global it imports
/// with `allowed(module, name)`. Never panics, on any bytes.
pub fn scan(bytes: &[u8], allowed: &dyn Fn(&str, &str) -> bool) -> Result<(), PickleError> {
    let mut walk = Walk {
        bytes,
        pos: 0,
        stack: vec![],
        memo: HashMap::new(),
        allowed,
    };
    loop {
        let at = walk.pos;
        let op = walk.take(1)?[0];
        if !walk.step(op, at)? {
            return Ok(());
        }
    }
}

struct Walk<'a> {
    bytes: &'a [u8],
    pos: usize,
    stack: Vec<Item>,
    memo: HashMap<u64, Item>,
    allowed: &'a dyn Fn(&str, &str) -> bool,
}

impl<'a> Walk<'a> {
    fn refused(&self, why: impl Into<String>) -> PickleError {
        PickleError::Refused {
            offset: self.pos,
            why: why.into(),
        }
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], PickleError> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n))
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| self.refused("ends before its STOP: it is truncated"))?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn le(&mut self, n: u64) -> Result<u64, PickleError> {
        let bytes = self.take(n)?;
        Ok(bytes
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    /// A newline-terminated text argument (protocol 0), without its newline.
    fn line(&mut self) -> Result<&'a str, PickleError> {
        let rest = &self.bytes[self.pos..];
        let len = rest
            .iter()
            .take(MAX_LINE)
            .position(|&b| b == b'\n')
            .ok_or_else(|| self.refused("has a text argument without its newline"))?;
        let text = std::str::from_utf8(&rest[..len])
            .map_err(|_| self.refused("has a text argument that is not UTF-8"))?;
        self.pos += len + 1;
        Ok(text)
    }

    fn push(&mut self, item: Item) -> Result<(), PickleError> {
        if self.stack.len() + self.memo.len() >= MAX_ITEMS {
            return Err(self.refused(format!("holds more than {MAX_ITEMS} objects at once")));
        }
        self.stack.push(item);
        Ok(())
    }

    fn pop(&mut self) -> Result<Item, PickleError> {
        match self.stack.pop() {
            Some(Item::Mark) | None => Err(self.refused("takes from an empty stack")),
            Some(item) => Ok(item),
        }
    }

    fn pop_n(&mut self, n: usize) -> Result<(), PickleError> {
        (0..n).try_for_each(|_| self.pop().map(drop))
    }

    /// Pops down to the topmost mark; returns how many entries were above it.
    fn pop_mark(&mut self) -> Result<usize, PickleError> {
        let at = self
            .stack
            .iter()
            .rposition(|i| *i == Item::Mark)
            .ok_or_else(|| self.refused("takes a mark that was never set"))?;
        let above = self.stack.len() - at - 1;
        self.stack.truncate(at);
        Ok(above)
    }

    /// Pops `n` entries, and checks that something is left under them (the list or dict
    /// they go into).
    fn pop_into(&mut self, n: usize) -> Result<(), PickleError> {
        self.pop_n(n)?;
        self.top().map(drop)
    }

    fn top(&self) -> Result<Item, PickleError> {
        match self.stack.last() {
            Some(Item::Mark) | None => Err(self.refused("takes from an empty stack")),
            Some(item) => Ok(item.clone()),
        }
    }

    fn global(&self, module: &str, name: &str, at: usize) -> Result<(), PickleError> {
        if (self.allowed)(module, name) {
            return Ok(());
        }
        Err(PickleError::Global {
            module: module.to_owned(),
            name: name.to_owned(),
            offset: at,
        })
    }

    fn name(bytes: &[u8]) -> Item {
        match std::str::from_utf8(bytes) {
            Ok(s) if s.len() <= MAX_NAME => Item::Name(s.to_owned()),
            _ => Item::Other,
        }
    }

    fn memo_get(&mut self, index: u64) -> Result<(), PickleError> {
        let item = self
            .memo
            .get(&index)
            .cloned()
            .ok_or_else(|| self.refused(format!("reads memo entry {index}, never stored")))?;
        self.push(item)
    }

    fn memo_put(&mut self, index: u64) -> Result<(), PickleError> {
        let item = self.top()?;
        if self.stack.len() + self.memo.len() >= MAX_ITEMS {
            return Err(self.refused(format!("holds more than {MAX_ITEMS} objects at once")));
        }
        self.memo.insert(index, item);
        Ok(())
    }

    fn text_index(&mut self) -> Result<u64, PickleError> {
        let line = self.line()?;
        line.trim()
            .parse()
            .map_err(|_| self.refused(format!("has a memo index `{line}` that is no number")))
    }

    /// A length of `n` bytes, then that many bytes.
    fn sized(&mut self, n: u64) -> Result<&'a [u8], PickleError> {
        let len = self.le(n)?;
        self.take(len)
    }

    /// Runs one opcode's effect on the modelled stack; false at `STOP`.
    fn step(&mut self, op: u8, at: usize) -> Result<bool, PickleError> {
        match op {
            b'.' => return Ok(false),
            b'(' => self.push(Item::Mark)?,
            b'0' => self.pop_n(1)?,
            b'1' => self.pop_mark().map(drop)?,
            b'2' => {
                let top = self.top()?;
                self.push(top)?;
            }
            b'F' | b'I' | b'L' | b'S' | b'P' => self.line().and_then(|_| self.push(Item::Other))?,
            b'V' => {
                let text = self.line()?;
                self.push(Self::name(text.as_bytes()))?;
            }
            b'J' => self.take(4).and_then(|_| self.push(Item::Other))?,
            b'K' | 0x80 => self.take(1).map(drop).and_then(|()| match op {
                b'K' => self.push(Item::Other),
                _ => Ok(()),
            })?,
            b'M' => self.take(2).and_then(|_| self.push(Item::Other))?,
            b'G' => self.take(8).and_then(|_| self.push(Item::Other))?,
            0x95 => self.take(8).map(drop)?,
            b'N' | b'}' | b']' | b')' | 0x88 | 0x89 | 0x8f => self.push(Item::Other)?,
            b'Q' | 0x85 => self.pop_n(1).and_then(|()| self.push(Item::Other))?,
            b'R' | 0x81 | 0x86 => self.pop_n(2).and_then(|()| self.push(Item::Other))?,
            0x87 | 0x92 => self.pop_n(3).and_then(|()| self.push(Item::Other))?,
            b'a' | b'b' => self.pop_into(1)?,
            b's' => self.pop_into(2)?,
            b'e' | b'u' | 0x90 => self.pop_mark().and_then(|_| self.pop_into(0))?,
            b'd' | b'l' | b't' | 0x91 => self.pop_mark().and_then(|_| self.push(Item::Other))?,
            b'o' => self.obj()?,
            b'c' | b'i' => self.text_global(op, at)?,
            0x93 => self.stack_global(at)?,
            b'T' => {
                let len = self.le(4)?;
                if len > i32::MAX as u64 {
                    return Err(self.refused("has a string of negative length"));
                }
                self.take(len).and_then(|_| self.push(Item::Other))?
            }
            0x8b => {
                let len = self.le(4)?;
                if len > i32::MAX as u64 {
                    return Err(self.refused("has a number of negative length"));
                }
                self.take(len).and_then(|_| self.push(Item::Other))?
            }
            b'U' | b'C' | 0x8a => self.sized(1).and_then(|_| self.push(Item::Other))?,
            b'B' => self.sized(4).and_then(|_| self.push(Item::Other))?,
            0x8e | 0x96 => self.sized(8).and_then(|_| self.push(Item::Other))?,
            b'X' => {
                let text = self.sized(4)?;
                self.push(Self::name(text))?;
            }
            0x8c | 0x8d => {
                let text = self.sized(if op == 0x8c { 1 } else { 8 })?;
                self.push(Self::name(text))?;
            }
            b'g' => {
                let index = self.text_index()?;
                self.memo_get(index)?;
            }
            b'h' | b'j' => {
                let index = self.le(if op == b'h' { 1 } else { 4 })?;
                self.memo_get(index)?;
            }
            b'p' => {
                let index = self.text_index()?;
                self.memo_put(index)?;
            }
            b'q' | b'r' => {
                let index = self.le(if op == b'q' { 1 } else { 4 })?;
                self.memo_put(index)?;
            }
            0x94 => self.memo_put(self.memo.len() as u64)?,
            0x82..=0x84 => {
                return Err(self.refused(
                    "imports through the extension registry (EXT1/2/4), which can name any \
                     callable",
                ));
            }
            0x97 | 0x98 => return Err(self.refused("uses out-of-band buffers")),
            other => return Err(self.refused(format!("has the opcode 0x{other:02x}, no pickle's"))),
        }
        Ok(true)
    }

    /// `OBJ`: a class and its arguments, above a mark.
    fn obj(&mut self) -> Result<(), PickleError> {
        if self.pop_mark()? == 0 {
            return Err(self.refused("builds an object without its class"));
        }
        self.push(Item::Other)
    }

    /// `GLOBAL` (and `INST`, which also pops its arguments down to a mark).
    fn text_global(&mut self, op: u8, at: usize) -> Result<(), PickleError> {
        let module = self.line()?;
        let name = self.line()?;
        self.global(module, name, at)?;
        if op == b'i' {
            self.pop_mark()?;
        }
        self.push(Item::Other)
    }

    /// `STACK_GLOBAL`: module and name from the stack, which must be string constants.
    fn stack_global(&mut self, at: usize) -> Result<(), PickleError> {
        let name = self.pop()?;
        let module = self.pop()?;
        let (Item::Name(module), Item::Name(name)) = (module, name) else {
            return Err(
                self.refused("imports a global whose name is not a string constant (STACK_GLOBAL)")
            );
        };
        self.global(&module, &name, at)?;
        self.push(Item::Other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn only_ordered_dict(module: &str, name: &str) -> bool {
        (module, name) == ("collections", "OrderedDict")
    }

    /// `os.system("touch /tmp/x")` as protocol 0 and protocol 4 write it.
    const GLOBAL_REDUCE: &[u8] = b"cos\nsystem\n(S'touch /tmp/x'\ntR.";
    const STACK_GLOBAL_REDUCE: &[u8] =
        b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94\x93\x94\x8c\x0btouch /tmp/x\x94\x85\x94R\x94.";

    #[test]
    fn a_global_outside_the_list_is_named() {
        for (bytes, offset) in [(GLOBAL_REDUCE, 0), (STACK_GLOBAL_REDUCE, 25)] {
            let e = scan(bytes, &only_ordered_dict).unwrap_err();
            assert_eq!(
                e,
                PickleError::Global {
                    module: "os".into(),
                    name: "system".into(),
                    offset
                }
            );
        }
    }

    #[test]
    fn names_read_back_from_the_memo_are_checked_too() {
        // The names stored with BINPUT and read back with BINGET, as pickle writes repeats.
        let p = b"\x80\x02\x8c\x0bcollections\x94\x8c\x0bOrderedDict\x94\x93)R\x8c\x0bcollections\x94h\x00h\x01\x93)R\x86.";
        assert_eq!(scan(p, &only_ordered_dict), Ok(()));
        let p = b"\x80\x02\x8c\x02os\x94\x8c\x0bOrderedDict\x94\x93)Rh\x00\x8c\x06system\x93.";
        assert!(matches!(
            scan(p, &|_, n| n == "OrderedDict"),
            Err(PickleError::Global { .. })
        ));
    }

    #[test]
    fn computed_names_and_the_extension_registry_are_refused() {
        // STACK_GLOBAL over the result of a call, not a constant.
        let p = b"\x80\x04ccollections\nOrderedDict\n)R\x8c\x01x\x93.";
        let e = scan(p, &only_ordered_dict).unwrap_err().to_string();
        assert!(e.contains("not a string constant"), "{e}");
        let e = scan(b"\x80\x02\x82\x01)R.", &only_ordered_dict).unwrap_err();
        assert!(e.to_string().contains("extension registry"), "{e}");
    }

    #[test]
    fn malformed_pickles_are_refused_not_panicked_on() {
        let cases: &[&[u8]] = &[
            b"",
            b"\x80",
            b"\x80\x02",
            b"0.",
            b"t.",
            b"\x80\x02h\x05.",
            b"\x80\x02X\xff\xff\xff\xff",
            b"\x80\x02\x8d\xff\xff\xff\xff\xff\xff\xff\xff",
            b"\x80\x02T\xff\xff\xff\xff.",
            b"cos",
            b"\xff.",
        ];
        for case in cases {
            let r = scan(case, &only_ordered_dict);
            assert!(
                matches!(r, Err(PickleError::Refused { .. })),
                "{case:?}: {r:?}"
            );
        }
    }

    #[test]
    fn a_tensor_pickle_of_pytorchs_writer_passes() {
        // torch.save({"w": torch.zeros(2)})'s data.pkl (protocol 2).
        let p = b"\x80\x02}q\x00X\x01\x00\x00\x00wq\x01ctorch._utils\n_rebuild_tensor_v2\nq\x02((X\x07\x00\x00\x00storageq\x03ctorch\nFloatStorage\nq\x04X\x01\x00\x00\x000q\x05X\x03\x00\x00\x00cpuq\x06K\x02tq\x07QK\x00K\x02\x85q\x08K\x01\x85q\x09\x89ccollections\nOrderedDict\nq\x0a)Rq\x0btq\x0cRq\x0ds.";
        let torch = |m: &str, n: &str| {
            matches!(
                (m, n),
                ("torch._utils", "_rebuild_tensor_v2")
                    | ("torch", "FloatStorage")
                    | ("collections", "OrderedDict")
            )
        };
        assert_eq!(scan(p, &torch), Ok(()));
    }
}
