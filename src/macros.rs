//! The crate's own `macro_rules!`, declared first in `lib.rs` so that every
//! module can use them.

/// `get_ref`, `get_mut` and `into_inner` for a service that keeps its inner
/// service in a field, invoked in its `impl` as
/// `inner_service_accessors!(inner: S)`: written once, so that every layer's
/// service offers the three alike and documented alike.
macro_rules! inner_service_accessors {
    ($field:ident: $Inner:ty) => {
        /// The inner service.
        pub fn get_ref(&self) -> &$Inner {
            &self.$field
        }

        /// The inner service, mutably.
        pub fn get_mut(&mut self) -> &mut $Inner {
            &mut self.$field
        }

        /// The inner service, unwrapped.
        pub fn into_inner(self) -> $Inner {
            self.$field
        }
    };
}

/// A layer's handle's constructor from the layer's cell (see
/// [`Home`](crate::home::Home)), its `Debug` showing the state the cell
/// holds now, and its hook for the metrics reporter, invoked beside the
/// handle as `handle_on_cell!(RateLimitHandle, Limiter)`: written once, so
/// that every handle is made, printed and reported alike.
macro_rules! handle_on_cell {
    ($Handle:ident, $State:ty) => {
        impl $Handle {
            pub(crate) fn new(cell: $crate::home::Cell<$State>) -> Self {
                Self { cell }
            }

            /// Record each admitted wait in `histogram` (see
            /// [`MetricsReporter`](crate::stats::MetricsReporter)).
            #[cfg(feature = "metrics")]
            pub(crate) fn record_waits_in(&self, histogram: ::metrics::Histogram) {
                self.cell.load().stats.record_waits_in(histogram);
            }
        }

        impl ::std::fmt::Debug for $Handle {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_tuple(stringify!($Handle))
                    .field(&*self.cell.load())
                    .finish()
            }
        }
    };
}
