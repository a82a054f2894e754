// Package jsstore keeps host/store's stored sessions, display rows, runs
// and event journal on NATS JetStream (Store), so that any host of a
// cluster can rebuild any session, and the credentials every host
// accepts from clients in the KV bucket tether_credentials
// (ClientCredentials: each host's access token, page sign-ins, keyed by
// its secret's SHA-256, watched by every host so that a client signed in
// on one host is accepted by all).
//
// Store has the method set, errors and orders of host/store's *Store,
// and passes the same conformance suite (host/store/storetest). Its
// layout, for prefix p (default "tether"):
//
//   - Bucket p_store (history 1, direct gets off as for the ownership
//     bucket): one key s.<key> per stored session, its row as JSON —
//     title, parent, fork count, times, end reason, epoch and last seq,
//     agent state, and its runs. Every change is a compare-and-swap: read
//     the row and its revision, change it, Update at that revision, and
//     read again when another host won (CreateSession is a KV Create, so
//     of two hosts creating one key one gets store.ErrExists).
//   - Stream P_EVENTS, subjects p.journal.<key>: one message per event,
//     its seq in a Tether-Seq header, its params as the body. An append
//     is published with the expected last sequence of the subject, the
//     stream sequence of the session's last event, so the journal's seqs
//     are exactly the session's: a seq already journaled is skipped (as
//     host/store ignores it), one that would leave a gap is refused with
//     store.ErrInvalid (unless the journal is empty), and of two hosts
//     appending the same seq one writes it and the other finds it there.
//     Retention is host/store's: a purge of the subject keeping PerSession
//     once its top passes that, and a purge of the stream keeping Total
//     once the stream's sequence passes that. For PerSessionBytes each
//     message also carries, in a Tether-Bytes-Before header, the bytes
//     of the session's events before it (pruned ones included), so a
//     journal's bytes are its last message's end less its first's
//     header: past the bound, the subject is purged before the first
//     message whose header is at least the end less the bound (found
//     from the first message's next, then by halving stream sequences),
//     never its last. EventsSince reads the
//     subject's first and last messages for the bounds, seeks the first
//     wanted event by interpolating between stream sequences, and reads
//     from there through a consumer of that read only, deleted after it.
//   - Stream P_MESSAGES, subjects p.messages.<key>: one message per
//     append (a JSON array of display rows, with the index of its first
//     row, its row count and its own index in headers), published with
//     the subject's expected last sequence: an append's rows are stored
//     together or not at all and stay adjacent, and the last message
//     gives the session's message count in one read.
//
// Tests: the suite on one server (TestJSStoreConformance) and on three
// routed ones with 3 replicas, each store on another node
// (TestJSStoreConformanceCluster: there a read's new consumer may not be
// known yet to the connection's server, and the fetch is asked again);
// two hosts racing on one session (TestJSStoreTwoHosts); a session
// continued by another host (TestJSStoreRebuildOnAnotherHost); journals
// interleaved in the stream (TestJSStoreInterleavedJournals).
//
// One stream with a subject per session rather than a stream per
// session: a stream per session would make the stream sequence the
// session seq and each append a plain expected-last-sequence publish,
// but every stream is an object the servers keep (a Raft group of its
// own on a replicated cluster), created before a session's first event,
// and the total retention would have to be enforced across streams. The
// figures are in BENCHMARKS.md ("JetStream store").
//
// What Store does not do as the SQLite store does:
//
//   - A write of several parts is not one transaction. Commit writes, per
//     session, its events, then its display rows, then its row; StartTurn
//     the prompt row, then the run. A fault stops it with
//     store.ErrUnavailable and leaves the parts already written. A
//     Commit tried again as the table's journal does (the same entries
//     first) journals no event twice, and does not store a session's
//     display rows twice when the session has events in it (each
//     Commit's rows carry the lowest seq of the session's events in it;
//     TestJSStoreCommitRetried). A StartTurn that failed after its prompt
//     row leaves that row. (JetStream's atomic batch publish,
//     AllowAtomicPublish, spans one stream and has no client API in
//     nats.go's jetstream package yet.)
//   - FindByTitle and List read every row (the bucket has no index), and
//     List reads each listed session's last display message for its
//     count. They read the rows through a watch, whose consumer may be on
//     a replica that has not applied the latest writes yet, so they first
//     ask the stream leader for the last row's stream sequence and read
//     the watch until it delivered that one (TestCollectRows).
//   - Every error that is not the caller's (not found, exists, invalid)
//     wraps store.ErrUnavailable, reads included: to the table, the
//     cluster's storage is unavailable, 5003. One that says the servers
//     did not answer or cannot decide now (a timeout, no responders, no
//     meta or stream leader: noAnswer) wraps store.ErrUnreachable too.
//     Reachable asks the meta leader and the leaders of the bucket and
//     both streams at once; the table asks it, within its ownership
//     bound, before a resume rebuilds a session, and answers a resume
//     that meets ErrUnreachable 5002 (retry) at once: after a server
//     went away, its streams have no leader until the others elect one
//     (nats-server's election timeout, 4 to 9 s), and every read would
//     otherwise wait out its own timeout (5 s) and answer 5003.
//     (TestNoAnswer, TestJSStoreReachable.)
//   - QuickCheck checks that the bucket and streams answer and keep their
//     configuration (no limits that would drop messages behind the
//     store's back): ErrDamaged when one is gone or changed.
//   - Close only stops the store's use; the connection is the caller's.
package jsstore
