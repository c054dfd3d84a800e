//! The event contract shared by every aggregate: type names, schema versions, payloads, metadata.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::DecodeError;

/// The schema version every event type is written with today.
///
/// A type's payload gets a new version only when an old reader could misread the new shape;
/// [`DomainEvent::from_stored`] then needs an upcaster for the old one.
pub const SCHEMA_VERSION: u32 = 1;

/// What the store needs to persist an event and to read it back.
///
/// It exists so that the store never knows an aggregate's event types: it keeps the type name,
/// the schema version and the payload bytes side by side, and asks the event enum to rebuild
/// itself. The payload holds only the variant's own struct; the type name travels separately,
/// so a payload's JSON is the same whichever enum carries it.
pub trait DomainEvent: Sized {
    /// Every type name this enum can produce, in declaration order.
    const EVENT_TYPES: &'static [&'static str];

    /// The stable type name, spelled exactly like the variant (`"Received"`, `"TokenIssued"`).
    fn event_type(&self) -> &'static str;

    /// The schema version of this event's payload.
    fn schema_version(&self) -> u32;

    /// The payload bytes: compact JSON of the variant's struct, fields in declaration order.
    fn to_payload(&self) -> serde_json::Result<Vec<u8>>;

    /// Rebuilds an event from what the store kept.
    fn from_stored(
        event_type: &str,
        schema_version: u32,
        payload: &[u8],
    ) -> Result<Self, DecodeError>;
}

/// Decodes one payload of a known event type: the single place where old schema versions would
/// be upcast before deserializing.
pub(crate) fn decode_payload<T: DeserializeOwned>(
    event_type: &str,
    schema_version: u32,
    payload: &[u8],
) -> Result<T, DecodeError> {
    // An upcaster for an older schema version of `event_type` goes here: it rewrites the old
    // payload into the current shape before the deserialization below. None exists yet.
    if schema_version != SCHEMA_VERSION {
        return Err(DecodeError::UnsupportedSchemaVersion {
            event_type: event_type.to_owned(),
            schema_version,
            supported: SCHEMA_VERSION,
        });
    }
    crate::text::from_stored_json(payload).map_err(|source| DecodeError::BadPayload {
        event_type: event_type.to_owned(),
        source,
    })
}

/// Declares an aggregate's event enum: one variant per event struct of the same name, plus its
/// kind enum, `From` conversions and the [`DomainEvent`] implementation.
///
/// It exists so that the type name, the payload and the decoder of a variant can never drift
/// apart: all three are derived from the one variant name.
macro_rules! domain_events {
    (
        $(#[$meta:meta])*
        pub enum $name:ident / $kind:ident {
            $( $(#[$vmeta:meta])* $variant:ident ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum $name {
            $( $(#[$vmeta])* $variant($variant), )+
        }

        #[doc = concat!("The kind of a [`", stringify!($name), "`], without its data.")]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $kind {
            $( #[doc = concat!("[`", stringify!($variant), "`].")] $variant, )+
        }

        impl $kind {
            /// Every kind, in declaration order.
            pub const ALL: &'static [$kind] = &[$($kind::$variant),+];

            /// The stable type name, the same as [`DomainEvent::event_type`](crate::event::DomainEvent::event_type).
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $kind::$variant => stringify!($variant), )+
                }
            }
        }

        impl ::std::fmt::Display for $kind {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl $name {
            /// The kind of this event.
            pub fn kind(&self) -> $kind {
                match self {
                    $( $name::$variant(_) => $kind::$variant, )+
                }
            }
        }

        $(
            impl From<$variant> for $name {
                fn from(event: $variant) -> Self {
                    $name::$variant(event)
                }
            }
        )+

        impl $crate::event::DomainEvent for $name {
            const EVENT_TYPES: &'static [&'static str] = &[$(stringify!($variant)),+];

            fn event_type(&self) -> &'static str {
                self.kind().as_str()
            }

            fn schema_version(&self) -> u32 {
                $crate::event::SCHEMA_VERSION
            }

            fn to_payload(&self) -> ::serde_json::Result<Vec<u8>> {
                match self {
                    $( $name::$variant(event) => ::serde_json::to_vec(event), )+
                }
            }

            fn from_stored(
                event_type: &str,
                schema_version: u32,
                payload: &[u8],
            ) -> Result<Self, $crate::error::DecodeError> {
                match event_type {
                    $(
                        stringify!($variant) => $crate::event::decode_payload(
                            event_type,
                            schema_version,
                            payload,
                        )
                        .map($name::$variant),
                    )+
                    other => Err($crate::error::DecodeError::UnknownEventType {
                        event_type: other.to_owned(),
                    }),
                }
            }
        }
    };
}

pub(crate) use domain_events;

/// Who or what caused an event, kept in its metadata so that every change can be traced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Causation {
    /// A Telegram update, delivered to the named bot.
    Update {
        /// The bot's configured name.
        bot: String,
        /// Telegram's `update_id`.
        update_id: i64,
    },
    /// A worker acting on an operation (claim, call, outcome, reply).
    Worker {
        /// The worker's id.
        worker: String,
    },
    /// A person, through the CLI or the admin API.
    Operator {
        /// Who the operator is, as authenticated.
        operator: String,
    },
    /// A client of the operations API (a bot's own handler), as authenticated.
    Client {
        /// The client's configured name (`[[api.clients]] name`).
        client: String,
    },
    /// A component of opledger acting on its own (a sweep, a migration).
    System {
        /// The component's name.
        component: String,
    },
}

/// The metadata stored beside every event's payload.
///
/// It says why the event exists (causation) and which originating update it belongs to
/// (correlation). The time the event was recorded is added by the store from its own clock;
/// the domain never stamps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventMetadata {
    /// Who or what caused the event.
    pub causation: Causation,
    /// The originating update's stream id, when there is one.
    pub correlation: Option<String>,
}

impl EventMetadata {
    /// Metadata with a causation and no correlation.
    pub fn caused_by(causation: Causation) -> Self {
        Self {
            causation,
            correlation: None,
        }
    }

    /// The same metadata, correlated with an originating update.
    pub fn correlated_with(mut self, correlation: impl Into<String>) -> Self {
        self.correlation = Some(correlation.into());
        self
    }

    /// The metadata bytes: compact JSON, fields in declaration order.
    pub fn to_bytes(&self) -> serde_json::Result<Vec<u8>> {
        serde_json::to_vec(self)
    }

    /// Reads metadata back from the bytes the store kept.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, DecodeError> {
        crate::text::from_stored_json(bytes).map_err(|source| DecodeError::BadMetadata { source })
    }
}
