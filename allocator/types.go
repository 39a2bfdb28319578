package allocator

import "github.com/rationhq/ration/allocator/ledger"

// The ledger's vocabulary, defined in the pure core (package ledger) and
// named here so that callers need only this package.
type (
	Caller            = ledger.Caller
	Status            = ledger.Status
	AcquireKey        = ledger.AcquireKey
	AcquireResult     = ledger.AcquireResult
	AcquireReply      = ledger.AcquireReply
	ReserveKey        = ledger.ReserveKey
	ReserveResult     = ledger.ReserveResult
	ReserveReply      = ledger.ReserveReply
	ReleaseKey        = ledger.ReleaseKey
	ReleaseReply      = ledger.ReleaseReply
	Snapshot          = ledger.Snapshot
	DimSnapshot       = ledger.DimSnapshot
	Stats             = ledger.Stats
	Policy            = ledger.Policy
	PolicyFunc        = ledger.PolicyFunc
	Demand            = ledger.Demand
	ShareByRate       = ledger.ShareByRate
	SharePolicy       = ledger.SharePolicy
	ShareDemand       = ledger.ShareDemand
	MaxMinShare       = ledger.MaxMinShare
	ProportionalShare = ledger.ProportionalShare
	InputError        = ledger.InputError
	StaleEpochError   = ledger.StaleEpochError
	QuotaError        = ledger.QuotaError
	Quota             = ledger.Quota
)

// DefaultShareHeadroom is the headroom of the default share policy.
const DefaultShareHeadroom = ledger.DefaultShareHeadroom

// Key statuses; see ledger.Status.
const (
	StatusOK         = ledger.StatusOK
	StatusNotCovered = ledger.StatusNotCovered
	StatusTooLarge   = ledger.StatusTooLarge
	StatusTooLate    = ledger.StatusTooLate
)
