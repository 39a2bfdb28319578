package ration

// How the allocator says why it refused a lease call, beside the connect
// code, so that a spender can act on it without parsing messages:
//
//   - CodeInvalidArgument carries a google.rpc.BadRequest whose field
//     violation names the offending field in the protocol's terms. A field
//     under "keys[i]." is one key's entry: the spender fails that key
//     alone and sends the rest of the batch again.
//   - CodeFailedPrecondition carries a google.rpc.ErrorInfo in ErrorDomain
//     whose Reason is one of the Reason values below.
//   - CodeUnavailable from a cluster member that is not the leader carries
//     an ErrorInfo whose Reason is ReasonNotLeader and whose metadata
//     MetaLeader is the leader's lease API base URL (absent while the
//     member knows no leader). Nothing was applied: the spender sends the
//     same call (same epoch, sequence and body) to the leader. (A member
//     that lost its leadership with the call in flight answers the same
//     way; the call may then have been applied, and the same call sent to
//     the leader gets its stored reply.)
const (
	ErrorDomain = "lease.ration.dev"

	// ReasonStaleEpoch: the call's epoch is below the latest the allocator
	// has seen for the spender id, given in the metadata MetaLatestEpoch.
	ReasonStaleEpoch = "STALE_EPOCH"
	// ReasonStaleSequence: the sequence is below the latest applied.
	ReasonStaleSequence = "STALE_SEQUENCE"
	// ReasonSequenceReused: the latest sequence again, with another body.
	ReasonSequenceReused = "SEQUENCE_REUSED"
	// ReasonEpochReleased: Release closed the call's epoch.
	ReasonEpochReleased = "EPOCH_RELEASED"
	// ReasonNotLeader: the member answering is not the cluster's leader.
	ReasonNotLeader = "NOT_LEADER"

	// MetaLatestEpoch is the ErrorInfo metadata key holding, in decimal,
	// the latest epoch the allocator has seen for the spender id.
	MetaLatestEpoch = "latest_epoch"
	// MetaLeader is the ErrorInfo metadata key holding the leader's lease
	// API base URL ("http://host:port" or "https://host:port").
	MetaLeader = "leader"
)
