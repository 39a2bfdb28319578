package lease

import (
	"time"

	"github.com/rationhq/ration"
)

// Entry is one key of an Acquire: its limits, what it asks for (Want, at
// least Need: the least grant worth having), its spend rate and demand
// (per minute), what it gives back, what it holds and what it owes. Every
// amount is within the range the protocol carries (ration.Amount.Clamp).
type Entry struct {
	Key       string
	Limits    ration.Limits
	Want      ration.Amount
	Need      ration.Amount
	SpendRate ration.Amount
	Returned  ration.Amount
	Held      ration.Amount
	Debt      ration.Amount
	Demand    ration.Amount
}

// GrantStatus is the allocator's verdict on one key (the protocol's
// GrantStatus values; any other is none of these).
type GrantStatus uint8

const (
	GrantOK         GrantStatus = 1 // granted (Acquire) or reserved (ReserveAhead)
	GrantNotCovered GrantStatus = 2 // the global buckets cannot cover the need before RetryAfter
	GrantTooLarge   GrantStatus = 3 // the need can never fit the limits
	GrantTooLate    GrantStatus = 4 // ReserveAhead: covered only after the caller's maximum wait
)

// Grant is the allocator's answer to one Entry.
type Grant struct {
	Status     GrantStatus
	Granted    ration.Amount
	RetryAfter time.Duration // GrantNotCovered: the exact wait for the global buckets
	Held       ration.Amount // what the allocator counts this spender as holding, if HasHeld
	HasHeld    bool
	Share      ration.Share  // the refill share (zero: none)
	Burst      ration.Amount // the share's burst
	Fair       ration.Share  // the fair share for the demand, if HasFair (otherwise the share)
	HasFair    bool
	Snapshot   *Snapshot // the key's global buckets (nil: not reported)
	Active     uint32    // spenders holding a lease on the key (0: not reported)
	Returned   ration.Amount
}

// AheadEntry is one key of a ReserveAhead: reserve Cost at the earliest
// time the global buckets cover it, if within MaxWait.
type AheadEntry struct {
	Key     string
	Limits  ration.Limits
	Cost    ration.Amount
	MaxWait time.Duration
}

// Reserved is the allocator's answer to one AheadEntry: GrantOK with the
// wait before the send time, or a refusal with the wait it would take.
type Reserved struct {
	Status   GrantStatus
	Wait     time.Duration
	Snapshot *Snapshot
}

// ReleaseEntry is one key of a Release: what it gives back and what it
// owes.
type ReleaseEntry struct {
	Key      string
	Limits   ration.Limits
	Returned ration.Amount
	Debt     ration.Amount
}
