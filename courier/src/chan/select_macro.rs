//! The `select!` macro: [`Select`](super::Select) in the shape of crossbeam-channel's
//! `select!` (`crossbeam-channel/src/select_macro.rs`).
//!
//! The macro is a token muncher. `@parse` turns the arms into a list, one bracketed item per
//! operation, and gives each item three names of its own (an identifier made by a separate
//! expansion is a separate binding): the end, the operation's index, and the slot its result
//! lands in. `@emit` then writes, in this order:
//!
//! 1. one `Option` per arm for its result;
//! 2. in an inner block, a reference to each channel expression (evaluated once, in order,
//!    and bound before the select so that a temporary one, `after(..)` say, outlives it), a
//!    `Select` with every operation registered, the wait, and the completion of the chosen
//!    operation, whose result goes into its arm's `Option`;
//! 3. the arms' bodies, in an `if let` chain on those `Option`s, then the `default` body.
//!
//! So every body runs after the inner block has ended, which matters twice. The select and the
//! chosen operation borrow the channel expressions; with them gone, a body may assign to the
//! variable it received from (a disconnected receiver swapped for [`never()`](super::never),
//! say). And a body is the tail of its branch, never the operand of a call, so a body that
//! diverges (`break`, `return`, `continue`, a panic) leaves no unreachable code behind it.

/// Waits on several channel operations and runs the arm of the one that completes: the
/// [`Select`](crate::chan::Select) builder in the shape of crossbeam-channel's `select!`.
///
/// ```text
/// select! {
///     recv(receiver) -> result => body,          // result: Result<T, RecvError>
///     send(sender, message) -> result => body,   // result: Result<(), SendError<T>>
///     default => body,                           // optional: none ready now
///     default(timeout) => body,                  // or: none ready within `timeout`
/// }
/// ```
///
/// Each channel expression is evaluated once, before waiting; a `send` arm's message
/// expression only if that arm is chosen, between the choice and the send, so it must not
/// leave early or panic: on a thread-safe channel the choice holds a reservation, and
/// dropping it aborts the process (see [`SelectedOperation`](crate::chan::SelectedOperation)).
/// Without a `default` arm it blocks until some operation can complete; a disconnected channel
/// counts as ready (its arm gets the `Err`).
///
/// Bodies are plain code in the caller's function: `return`, `break`, `continue` and `?` work
/// as written. Every body has the same type, which is the value of the `select!`. A body runs
/// once the operation is complete and the select has let go of the channel expressions, so it
/// may assign to the variables they named: in a loop, a receiver whose channel disconnected
/// (an arm that would be ready for ever) leaves by being swapped for
/// [`never()`](crate::chan::never) (the example there shows it). A channel expression may be
/// a temporary, such as a timeout's [`after(..)`](crate::chan::after).
///
/// ```
/// use std::time::Duration;
/// use courier::chan;
///
/// let (tx1, rx1) = chan::unbounded::<i32>();
/// let (tx2, rx2) = chan::bounded::<&str>(1);
/// tx1.send(7).unwrap();
///
/// let got = courier::select! {
///     recv(rx1) -> msg => format!("rx1: {}", msg.unwrap()),
///     send(tx2, "hi") -> res => { res.unwrap(); "sent".to_owned() }
///     default(Duration::from_millis(10)) => "nothing".to_owned(),
/// };
/// assert!(got == "rx1: 7" || got == "sent");
/// # drop(rx2);
/// ```
///
/// In a loop, `break` leaves it from any arm, a `default` one included:
///
/// ```
/// # #![deny(warnings)]
/// use std::time::Duration;
/// use courier::chan;
///
/// let (tx, rx) = chan::unbounded::<u32>();
/// (0..3).for_each(|i| tx.send(i).unwrap());
/// let mut sum = 0;
/// loop {
///     courier::select! {
///         recv(rx) -> msg => sum += msg.unwrap(),
///         default(Duration::from_millis(1)) => break,
///     }
/// }
/// assert_eq!(sum, 3);
/// ```
#[macro_export]
macro_rules! select {
    ($($arms:tt)+) => {
        $crate::__select_internal!(@parse () $($arms)+)
    };
}

/// The steps of [`select!`] (see the `select_macro` module's docs).
#[doc(hidden)]
#[macro_export]
macro_rules! __select_internal {
    // ===== @parse: one item per arm, `[kind index end result (..) ..]` =====

    // recv, with a block body, then an optional comma.
    (@parse ($($arms:tt)*) recv($rx:expr) -> $res:pat => $body:block, $($rest:tt)*) => {
        $crate::__select_internal!(@parse ($($arms)* [recv __courier_index __courier_end
            __courier_result ($rx) ($res) ($body)]) $($rest)*)
    };
    (@parse ($($arms:tt)*) recv($rx:expr) -> $res:pat => $body:block $($rest:tt)*) => {
        $crate::__select_internal!(@parse ($($arms)* [recv __courier_index __courier_end
            __courier_result ($rx) ($res) ($body)]) $($rest)*)
    };
    // recv, with an expression body.
    (@parse ($($arms:tt)*) recv($rx:expr) -> $res:pat => $body:expr, $($rest:tt)*) => {
        $crate::__select_internal!(@parse ($($arms)* [recv __courier_index __courier_end
            __courier_result ($rx) ($res) ($body)]) $($rest)*)
    };
    (@parse ($($arms:tt)*) recv($rx:expr) -> $res:pat => $body:expr) => {
        $crate::__select_internal!(@parse ($($arms)* [recv __courier_index __courier_end
            __courier_result ($rx) ($res) ($body)]))
    };
    // send, the same four shapes.
    (@parse ($($arms:tt)*) send($tx:expr, $msg:expr) -> $res:pat => $body:block, $($rest:tt)*) => {
        $crate::__select_internal!(@parse ($($arms)* [send __courier_index __courier_end
            __courier_result ($tx) ($msg) ($res) ($body)]) $($rest)*)
    };
    (@parse ($($arms:tt)*) send($tx:expr, $msg:expr) -> $res:pat => $body:block $($rest:tt)*) => {
        $crate::__select_internal!(@parse ($($arms)* [send __courier_index __courier_end
            __courier_result ($tx) ($msg) ($res) ($body)]) $($rest)*)
    };
    (@parse ($($arms:tt)*) send($tx:expr, $msg:expr) -> $res:pat => $body:expr, $($rest:tt)*) => {
        $crate::__select_internal!(@parse ($($arms)* [send __courier_index __courier_end
            __courier_result ($tx) ($msg) ($res) ($body)]) $($rest)*)
    };
    (@parse ($($arms:tt)*) send($tx:expr, $msg:expr) -> $res:pat => $body:expr) => {
        $crate::__select_internal!(@parse ($($arms)* [send __courier_index __courier_end
            __courier_result ($tx) ($msg) ($res) ($body)]))
    };
    // The last arm may be a default: wait not at all, or at most a timeout.
    (@parse ($($arms:tt)*) default => $body:expr $(,)?) => {
        $crate::__select_internal!(@emit ($($arms)*) (now) ($body))
    };
    (@parse ($($arms:tt)*) default($timeout:expr) => $body:expr $(,)?) => {
        $crate::__select_internal!(@emit ($($arms)*) (timeout $timeout) ($body))
    };
    // No arm left: wait for as long as it takes.
    (@parse ($($arms:tt)*)) => {
        $crate::__select_internal!(@emit ($($arms)*) (block))
    };

    // ===== @emit: results, then select and complete, then the bodies =====

    (@emit ($($arm:tt)*) $wait:tt $($default:tt)?) => {{
        $($crate::__select_internal!(@declare $arm);)*
        {
            $($crate::__select_internal!(@end $arm);)*
            let mut __courier_select = $crate::chan::Select::new();
            $($crate::__select_internal!(@register __courier_select $arm);)*
            $crate::__select_internal!(@wait __courier_select ($($arm)*) $wait);
        }
        $crate::__select_internal!(@run ($($arm)*) $($default)?)
    }};

    (@declare [$kind:ident $index:ident $end:ident $result:ident $($more:tt)*]) => {
        let mut $result = ::core::option::Option::None;
    };

    // Each end is bound before the select exists, so that a temporary one (`after(..)`)
    // outlives the select's borrow of it.
    (@end [$kind:ident $index:ident $end:ident $result:ident ($chan:expr) $($more:tt)*]) => {
        let $end = &$chan;
    };

    (@register $sel:ident [recv $index:ident $end:ident $($more:tt)*]) => {
        let $index = $sel.recv($end);
    };
    (@register $sel:ident [send $index:ident $end:ident $($more:tt)*]) => {
        let $index = $sel.send($end);
    };

    (@wait $sel:ident $arms:tt (block)) => {{
        let __courier_op = $sel.select();
        $crate::__select_internal!(@complete __courier_op $arms)
    }};
    (@wait $sel:ident $arms:tt (now)) => {
        if let ::core::result::Result::Ok(__courier_op) = $sel.try_select() {
            $crate::__select_internal!(@complete __courier_op $arms)
        }
    };
    (@wait $sel:ident $arms:tt (timeout $timeout:expr)) => {
        if let ::core::result::Result::Ok(__courier_op) = $sel.select_timeout($timeout) {
            $crate::__select_internal!(@complete __courier_op $arms)
        }
    };

    // Completes the chosen operation into its arm's result.
    (@complete $op:ident ([recv $index:ident $end:ident $result:ident $($more:tt)*]
        $($rest:tt)*)) => {
        if $op.index() == $index {
            $result = ::core::option::Option::Some($op.recv($end));
        } else {
            $crate::__select_internal!(@complete $op ($($rest)*))
        }
    };
    (@complete $op:ident ([send $index:ident $end:ident $result:ident ($tx:expr) ($msg:expr)
        $($more:tt)*] $($rest:tt)*)) => {
        if $op.index() == $index {
            $result = ::core::option::Option::Some($op.send($end, $msg));
        } else {
            $crate::__select_internal!(@complete $op ($($rest)*))
        }
    };
    (@complete $op:ident ()) => {
        ::core::unreachable!("select! chose operation {}, which no arm registered", $op.index())
    };

    // Runs the body of the arm whose result is there, else the default.
    (@run ([recv $index:ident $end:ident $result:ident ($rx:expr) ($res:pat) ($body:expr)]
        $($rest:tt)*) $($default:tt)?) => {
        if let ::core::option::Option::Some(__courier_got) = $result {
            let $res = __courier_got;
            $body
        } else {
            $crate::__select_internal!(@run ($($rest)*) $($default)?)
        }
    };
    (@run ([send $index:ident $end:ident $result:ident ($tx:expr) ($msg:expr) ($res:pat)
        ($body:expr)] $($rest:tt)*) $($default:tt)?) => {
        if let ::core::option::Option::Some(__courier_got) = $result {
            let $res = __courier_got;
            $body
        } else {
            $crate::__select_internal!(@run ($($rest)*) $($default)?)
        }
    };
    (@run () ($default:expr)) => {
        $default
    };
    (@run ()) => {
        ::core::unreachable!("select! returned without an operation or a default")
    };
}
