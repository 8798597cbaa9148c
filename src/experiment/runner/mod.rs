//! Running a sweep: the [`Session`] (target, drafters, prompts; `session.rs`) generates every
//! prompt at every point (`points.rs`), every turn of a conversation with the caches continued
//! (`conversation.rs`), and yields one [`ResultRecord`] per generation (`record.rs`).
mod conversation;
mod points;
mod record;
mod session;

pub use conversation::Conversations;
pub use record::{ResultRecord, SweepObserver};
pub use session::{DraftSource, EncodedPrompt, Session};
