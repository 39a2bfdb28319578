package allocator

import "time"

// Amount is a quantity in both dimensions of a key's budget: whole
// requests (against RPM) and whole tokens (against TPM). Amounts sent to
// the ledger must not be negative.
type Amount struct {
	Requests int64 // requests
	Tokens   int64 // tokens
}

// Limits are a key's budgets as the gateway's key record states them.
// A rate of 0 means unlimited: that dimension has no bucket and nothing is
// leased on it. A burst of 0 means one minute's budget (capacity = rate).
// Each limited dimension must form a valid bucket.Limit (see MaxRate).
type Limits struct {
	RPM           int64 // requests per minute; 0 = unlimited
	TPM           int64 // tokens per minute; 0 = unlimited
	BurstRequests int64 // request bucket capacity in requests; 0 = RPM
	BurstTokens   int64 // token bucket capacity in tokens; 0 = TPM
}

// Caller identifies a call for exactly-once processing: calls of one
// (SpenderID, Epoch) are applied in Sequence order, each at most once.
type Caller struct {
	SpenderID string // 1 to MaxSpenderIDLen bytes
	Epoch     uint64 // spender incarnation, > 0; a new epoch starts holding nothing
	Sequence  uint64 // call number within the epoch, > 0, strictly increasing
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
	Key       string // 1 to MaxKeyLen bytes
	Limits    Limits
	Want      Amount // wanted on top of what is held; the policy may grant less
	Need      Amount // least useful grant; 0 = any amount helps
	SpendRate Amount // observed spend per minute; 0 = unknown
	Returned  Amount // given back, credited up to the holding
	Held      Amount // still held after Returned: unspent plus unsettled
	Debt      Amount // overrun already admitted, charged even below zero
}

// DimSnapshot is one dimension of a key's global state; all zero when the
// dimension is unlimited.
type DimSnapshot struct {
	Limit     int64         // bucket capacity
	Remaining int64         // whole units left, rounded down, >= 0
	Reset     time.Duration // until the bucket is full again (microsecond precision)
}

// Snapshot is a key's global state, for x-ratelimit-* headers.
type Snapshot struct {
	Requests DimSnapshot
	Tokens   DimSnapshot
}

// AcquireResult is one key's answer to Acquire.
type AcquireResult struct {
	Status         Status
	Granted        Amount        // newly granted; echoes Want on an unlimited dimension
	Returned       Amount        // the part of Returned credited
	Held           Amount        // the ledger's holding for the caller after the call
	RetryAfter     time.Duration // with StatusNotCovered: from receipt until Need is covered
	Snapshot       Snapshot      // the key after the call
	ActiveSpenders int           // spenders with an unexpired lease, the caller included
}

// AcquireReply answers Acquire: Keys[i] answers request key i.
type AcquireReply struct {
	Keys     []AcquireResult
	LeaseTTL time.Duration // holdings on these keys are valid until first send + LeaseTTL
}

// ReserveKey asks to reserve one request's cost on one key (wait mode).
type ReserveKey struct {
	Key     string
	Limits  Limits
	Cost    Amount        // taken in full or not at all
	MaxWait time.Duration // longest acceptable wait, 0 to MaxWait
}

// ReserveResult is one key's answer to ReserveAhead.
type ReserveResult struct {
	Status         Status        // StatusOK, StatusTooLate or StatusTooLarge
	Wait           time.Duration // OK: send no earlier than receipt + Wait; TooLate: the wait needed
	Held           Amount        // the ledger's holding for the caller after the call
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
	Limits   Limits // used to charge Debt on a key the ledger no longer tracks
	Returned Amount // given back, credited up to the holding
	Debt     Amount // overrun, charged even below zero
}

// ReleaseReply answers Release: Returned[i] is the part of request key i's
// Returned that was credited.
type ReleaseReply struct {
	Returned []Amount
}
