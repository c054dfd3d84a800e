//! In-process effects written as closures.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use futures_util::future::BoxFuture;
use opledger_worker::{CallOutcome, EffectRequest, Effector};

/// An [`Effector`] made of an async closure; see [`effect_fn`].
pub struct EffectFn<F> {
    call: F,
    honours_idempotency_key: bool,
    timeout: Duration,
}

/// An in-process effect from an async closure that carries out one call of an operation.
///
/// The closure gets the [`EffectRequest`] (its `operation_id` is the idempotency key: the same
/// for every attempt of one operation) and answers what happened. Answer
/// [`CallOutcome::Unknown`] when the effect may or may not have happened: the worker then makes
/// the call again only if the effect [honours the key](EffectFn::honours_idempotency_key)
/// (a second call with the same key does nothing new and answers the first one's result),
/// else leaves the operation to an operator. A call that outlives its
/// [timeout](EffectFn::timeout) is unknown too.
///
/// ```
/// use opledger::{effect_fn, CallOutcome, Success};
///
/// let coupon = effect_fn(|request| async move {
///     // Issue the coupon in the shop, under `request.operation_id`...
///     CallOutcome::Succeeded(Success {
///         external_id: Some(format!("C-{}", &request.operation_id[..8])),
///         ..Success::default()
///     })
/// })
/// .honours_idempotency_key();
/// # let _ = coupon;
/// ```
pub fn effect_fn<F, Fut>(call: F) -> EffectFn<F>
where
    F: Fn(EffectRequest) -> Fut + Send + Sync,
    Fut: Future<Output = CallOutcome> + Send + 'static,
{
    EffectFn {
        call,
        honours_idempotency_key: false,
        timeout: Duration::from_secs(10),
    }
}

impl<F> EffectFn<F> {
    /// The effect does nothing new when called again with an operation id it has seen, and
    /// answers as it did: a call whose outcome is unknown is made again.
    pub fn honours_idempotency_key(mut self) -> Self {
        self.honours_idempotency_key = true;
        self
    }

    /// How long one call may take before its outcome counts as unknown (default 10 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

impl<F> fmt::Debug for EffectFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EffectFn")
            .field("honours_idempotency_key", &self.honours_idempotency_key)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl<F, Fut> Effector for EffectFn<F>
where
    F: Fn(EffectRequest) -> Fut + Send + Sync,
    Fut: Future<Output = CallOutcome> + Send + 'static,
{
    fn call<'a>(&'a self, request: &'a EffectRequest) -> BoxFuture<'a, CallOutcome> {
        Box::pin((self.call)(request.clone()))
    }

    fn honours_idempotency_key(&self) -> bool {
        self.honours_idempotency_key
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }
}
