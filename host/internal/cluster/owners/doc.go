// Package owners is who owns what in a cluster: the session ownership
// table on a JetStream KV bucket (KV, an ownership.Store), the hosts'
// heartbeats (Registry), the takeover of a key whose owner left the
// cluster (Takeover, the store the session table is given) and the host
// of each PTY attach token (PTYPlaces).
//
//   - KV, the KV bucket tether_sessions: one key per live stored
//     session, its value the owner record (host and process instance,
//     runtime session, binding generation, viewers) as JSON. Takeover
//     wraps it for the table: a create that finds the key owned takes it
//     over, by a revision-checked update, only when the owner left the
//     cluster, and otherwise answers *ownership.HeldError naming the
//     owner;
//   - Registry, the heartbeats in the KV bucket tether_hosts: each host
//     rewrites its entry every TTL/3 and ages the others' on its own clock
//     from when it saw them change (a watch; a host the watch says is gone
//     is asked about once more from the bucket's leader, so a watch that
//     fell behind never makes a live host look dead). A host that cannot
//     write its heartbeat for TTL/2 is fenced: the host releases its live
//     sessions before another may take them;
//   - PTYPlaces, the KV bucket tether_ptys: the host of each attach token,
//     claimed with a create by the host of its first attach.
//
// # Compare-and-swap
//
// A bind claims a key with Create and records every later binding with
// Update(key, value, revision); every teardown is an Update or a Delete
// at the revision the last write returned. The server accepts such a
// write only if the key's last message is at that revision (the
// expected-last-subject-sequence check, decided by the stream leader
// through the stream's Raft group on a replicated bucket), so of several
// hosts writing from one revision exactly one wins; the others get
// ownership.ErrConflict. The pitfalls of doing this on a KV bucket, and
// what holds each:
//
//   - A revision is the stream's sequence, shared by every key and taken
//     by delete markers too, not a per-key counter: a key's revisions
//     jump, and one more than a key's revision is some other message's.
//     Callers only ever present a revision a write returned.
//     (TestRevisionsAreStreamSequences; ownershiptest RevisionOfAnotherKey,
//     RevisionsGrow.)
//   - Revision 0 means "no message yet" to an update, which would create
//     the key, and "no check at all" to a delete, which would remove it
//     unconditionally: Update and Delete refuse it as a conflict without
//     asking the server. (ownershiptest RevisionZero.)
//   - A delete leaves a delete marker as the key's one message. Create
//     takes a key over its marker with an update at the marker's revision,
//     so creators racing over a deleted key have one winner; revisions of
//     the key's earlier life stay stale. (TestCreateOverDeleteMarker;
//     ownershiptest CreateAfterDelete, ConcurrentCreatesAfterDelete.)
//   - A direct get may be answered by any replica of the stream, or by a
//     mirror, possibly with a stale value: the library creates every
//     bucket with direct gets on and uses them whenever the stream allows
//     them. NewKV switches them off on the stream and reads the
//     configuration back into its handle, so every Get is a message get
//     answered by the stream leader; it refuses a bucket that is a mirror.
//     A Get still only informs: what decides is the revision-checked
//     write, so a stale read can cost a conflict, never a second owner.
//     (TestGetNeverDirect, TestBucketConfig.)
//   - On a replicated bucket the stream leader acknowledges a write
//     before it forgets the write in process, and meanwhile refuses the
//     key's next conditional write without comparing its revision (code
//     10164, which the library counts as a mismatch; 10163 likewise while
//     a new leader applies its log). Such a refusal wrote nothing: KV
//     asks again (1 ms, doubling up to 50 ms) until the server decides or
//     the context ends (ErrUnavailable, never ErrConflict). Without it, a
//     bind right after a teardown of the same session would be refused as
//     owned elsewhere. (TestBusyIsAskedAgain, TestClusterBackToBackWrites.)
//   - A watch sends a nil entry once it has delivered every key's last
//     value (at once on an empty bucket); List stops there, and drains the
//     watch when it stops it (its delivery blocks on a full channel).
//     (TestList.)
//
// Errors: the server refusing the revision wraps ownership.ErrConflict, a
// key with no value (never written, or deleted) ownership.ErrNoOwner, and
// anything else — a timeout, no responders, a closed connection, JetStream
// unavailable, a deleted bucket — ownership.ErrUnavailable, as the entry
// may or may not have changed. The nats error stays wrapped as well.
//
// # The bucket
//
// History 1: only the last revision of a key decides a compare-and-swap;
// older ones would only grow the stream. Each deleted key keeps one delete
// marker. File storage: an ownership entry must survive a restart of the
// NATS servers, or a host still serving a session would find its key free
// for another. Replicas: KVConfig.Replicas, 3 on a three-server cluster —
// the bucket then survives the loss of one server with every committed
// entry, and keeps deciding races with the two left (TestClusterNodeLoss,
// TestClusterOneWinner); with 1, the one server holding it is a single
// point of failure. No TTL or maximum age: an entry lives as long as its
// session's ownership. An existing bucket is used as it is, except for
// its direct gets.
//
// KV does not own its connection: the caller closes it after the last
// call.
package owners
