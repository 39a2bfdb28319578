package ledger

import (
	"time"

	"github.com/rationhq/ration"
)

// Caller identifies a call for exactly-once processing: calls of one
// (SpenderID, Epoch) are applied in Sequence order, each at most once.
type Caller struct {
	SpenderID string // 1 to ration.MaxSpenderIDLen bytes
	Epoch     uint64 // spender incarnation, > 0 and at most MaxEpochAhead past Now in ns; a new epoch starts holding nothing
	Sequence  uint64 // call number within the epoch, > 0, strictly increasing
	// Credential names what the call was authenticated with (the
	// allocator's TokenID of the bearer token), up to MaxCredentialLen
	// bytes; "" for a call with none (no auth, in-process). A spender id
	// belongs to the credential that created its session, and each
	// credential's sessions, keys and leases are bounded by Config.Quota.
	Credential string
}

// Status says how one key's Acquire or ReserveAhead went.
type Status uint8

const (
	// StatusOK: granted (possibly 0) or reserved.
	StatusOK Status = iota + 1
	// StatusNotCovered: the buckets do not cover Need now; nothing granted.
	StatusNotCovered
	// StatusTooLarge: Need or Cost exceeds a dimension's capacity.
	StatusTooLarge
	// StatusTooLate: ReserveAhead's wait would exceed MaxWait; nothing reserved.
	StatusTooLate
)

// String returns the status name.
func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusNotCovered:
		return "not_covered"
	case StatusTooLarge:
		return "too_large"
	case StatusTooLate:
		return "too_late"
	}
	return "unknown"
}

// AcquireKey is one key's part of an Acquire call. See proto KeyAcquire
// for the meaning of each field; all amounts are >= 0.
type AcquireKey struct {
	Key       string // 1 to ration.MaxKeyLen bytes
	Limits    ration.Limits
	Want      ration.Amount // wanted on top of what is held; the policy may grant less
	Need      ration.Amount // least useful grant; 0 = any amount helps
	SpendRate ration.Amount // observed spend per minute; 0 = unknown
	Returned  ration.Amount // given back, credited up to the holding
	Held      ration.Amount // still held after Returned: unspent plus unsettled
	Debt      ration.Amount // overrun already admitted, charged even below zero
	// Demand is what the spender's traffic asked per minute, admitted or
	// refused; a spender that sends one takes a refill share. 0 = no share.
	Demand ration.Amount
}

// DimSnapshot is one dimension of a key's global state; all zero when the
// dimension is unlimited.
type DimSnapshot struct {
	Limit     int64         // bucket capacity
	Remaining int64         // whole units left, rounded down, >= 0
	Reset     time.Duration // until the bucket is full again (microsecond precision)
	// Shared is the part of the refill rate the key's refill shares take,
	// in millionths (0 = none): the bucket refills at the rest.
	Shared uint32
}

// Snapshot is a key's global state, for x-ratelimit-* headers.
type Snapshot struct {
	Requests DimSnapshot
	Tokens   DimSnapshot
}

// AcquireResult is one key's answer to Acquire.
type AcquireResult struct {
	Status         Status
	Granted        ration.Amount // newly granted; echoes Want on an unlimited dimension
	Returned       ration.Amount // the part of Returned credited
	Held           ration.Amount // the ledger's holding for the caller after the call
	RetryAfter     time.Duration // with StatusNotCovered: from receipt until Need is covered
	Snapshot       Snapshot      // the key after the call
	ActiveSpenders int           // spenders with an unexpired lease, the caller included
	Share          ration.Share  // the refill share until the lease ends; zero without a Demand
	ShareBurst     ration.Amount // accrual stops while the spender holds this much
	ShareFair      ration.Share  // the policy's share for the demand; above Share: others still hold the rest
}

// AcquireReply answers Acquire: Keys[i] answers request key i.
type AcquireReply struct {
	Keys     []AcquireResult
	LeaseTTL time.Duration // holdings on these keys are valid until first send + LeaseTTL
}

// ReserveKey asks to reserve one request's cost on one key (wait mode).
type ReserveKey struct {
	Key     string
	Limits  ration.Limits
	Cost    ration.Amount // taken in full or not at all
	MaxWait time.Duration // longest acceptable wait, 0 to MaxWait
}

// ReserveResult is one key's answer to ReserveAhead.
type ReserveResult struct {
	Status         Status        // StatusOK, StatusTooLate or StatusTooLarge
	Wait           time.Duration // OK: send no earlier than receipt + Wait; TooLate: the wait needed
	Held           ration.Amount // the ledger's holding for the caller after the call
	Snapshot       Snapshot
	ActiveSpenders int
}

// ReserveReply answers ReserveAhead: Keys[i] answers request key i.
type ReserveReply struct {
	Keys     []ReserveResult
	LeaseTTL time.Duration // a reservation is valid until first send + Wait + LeaseTTL
}

// ReleaseKey is one key's part of a Release call.
type ReleaseKey struct {
	Key      string
	Limits   ration.Limits // used to charge Debt on a key the ledger no longer tracks
	Returned ration.Amount // given back, credited up to the holding
	Debt     ration.Amount // overrun, charged even below zero
}

// ReleaseReply answers Release: Returned[i] is the part of request key i's
// Returned that was credited.
type ReleaseReply struct {
	Returned []ration.Amount
}
