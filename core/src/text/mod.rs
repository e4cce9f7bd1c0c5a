//! The text format of the tile IR (`.tile` files).
//!
//! The printed form is canonical: parameters keep their names, every other value is numbered
//! `%0, %1, ..` in definition order, so `print(parse(print(f))) == print(f)` exactly. It is the
//! form golden tests compare and the form kernels are ported in.
//!
//! ```text
//! kernel @scale(%x: !ptr<f32>, %n: i32) attributes {warps = 4, stages = 2, cooperative = false} {
//!   %0 = program_id x : i32
//!   %1 = arange 0, 128 : tile<128xi32>
//!   ...
//!   store %7, %8, mask %6
//!   return
//! }
//! ```
//!
//! Every op is `[results =] mnemonic operands [, keyword operand]* [: result type]`; regions
//! are brace blocks ending in `yield` (omitted when nothing is yielded).

mod parse;
mod print;

pub use parse::{parse, ParseError};
pub use print::print;
