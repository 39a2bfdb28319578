package spender

import (
	"time"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/bucket"
	"github.com/rationhq/ration/internal/leasewire"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/spender/internal/lease"
)

// The lease protocol's messages and the lease core's types, each way.
// The core speaks only its own types; the driver converts at the edge.

// toKeyAcquire is an Acquire entry on the wire (the core clamps its
// amounts to the protocol's range).
func toKeyAcquire(en *lease.Entry) *leasev1.KeyAcquire {
	return &leasev1.KeyAcquire{
		Key: en.Key, Limits: leasewire.NewLimits(en.Limits),
		Want: leasewire.NewAmount(en.Want), Need: leasewire.NewAmount(en.Need), SpendRate: leasewire.NewAmount(en.SpendRate),
		Returned: leasewire.NewAmount(en.Returned), Held: leasewire.NewAmount(en.Held), Debt: leasewire.NewAmount(en.Debt), Demand: leasewire.NewAmount(en.Demand),
	}
}

// fromKeyGrant is the allocator's answer to one Acquire entry.
func fromKeyGrant(g *leasev1.KeyGrant) lease.Grant {
	out := lease.Grant{
		Granted:  leasewire.AmountOf(g.GetGranted()),
		Held:     leasewire.AmountOf(g.GetHeld()),
		HasHeld:  g.GetHeld() != nil,
		Share:    wireShare(g.GetShare()),
		Burst:    leasewire.AmountOf(g.GetShareBurst()),
		Fair:     wireShare(g.GetShareFair()),
		HasFair:  g.GetShareFair() != nil,
		Snapshot: fromSnapshot(g.GetSnapshot()),
		Active:   g.GetActiveSpenders(),
		Returned: leasewire.AmountOf(g.GetReturned()),
	}
	switch g.GetStatus() {
	case leasev1.GrantStatus_GRANT_STATUS_OK:
		out.Status = lease.GrantOK
	case leasev1.GrantStatus_GRANT_STATUS_NOT_COVERED:
		out.Status = lease.GrantNotCovered
		out.RetryAfter = wireDuration(g.GetRetryAfterUs())
	case leasev1.GrantStatus_GRANT_STATUS_TOO_LARGE:
		out.Status = lease.GrantTooLarge
	}
	return out
}

// fromKeyReservation is the allocator's answer to one ReserveAhead entry.
func fromKeyReservation(r *leasev1.KeyReservation) lease.Reserved {
	out := lease.Reserved{Wait: time.Duration(r.GetWaitUs()) * time.Microsecond, Snapshot: fromSnapshot(r.GetSnapshot())}
	switch r.GetStatus() {
	case leasev1.GrantStatus_GRANT_STATUS_OK:
		out.Status = lease.GrantOK
	case leasev1.GrantStatus_GRANT_STATUS_TOO_LARGE:
		out.Status = lease.GrantTooLarge
	case leasev1.GrantStatus_GRANT_STATUS_NOT_COVERED:
		out.Status = lease.GrantNotCovered
	case leasev1.GrantStatus_GRANT_STATUS_TOO_LATE:
		out.Status = lease.GrantTooLate
	}
	return out
}

// fromSnapshot is a key's global buckets as an answer reported them (nil:
// not reported).
func fromSnapshot(sn *leasev1.Snapshot) *lease.Snapshot {
	if sn == nil {
		return nil
	}
	return &lease.Snapshot{
		Remaining: ration.Amount{Requests: sn.GetRequests().GetRemaining(), Tokens: sn.GetTokens().GetRemaining()},
		Shared:    shareOf(sn.GetRequests().GetSharedPpm(), sn.GetTokens().GetSharedPpm()),
	}
}

// wireShare is a share on the wire, clamped to the whole rate.
func wireShare(s *leasev1.Share) ration.Share {
	return shareOf(s.GetRequestsPpm(), s.GetTokensPpm())
}

func shareOf(req, tok uint32) ration.Share {
	return ration.Share{Requests: min(req, ration.ShareUnit), Tokens: min(tok, ration.ShareUnit)}
}

// wireDuration converts a wait in microseconds from the allocator to a
// Duration: saturating rather than overflowing, and at least 1ms, so that a
// malformed (negative or zero) wait cannot make the key ask again in a loop.
func wireDuration(us int64) time.Duration {
	if us <= 0 {
		return time.Millisecond
	}
	if us > int64(bucket.InfDuration/time.Microsecond) {
		return bucket.InfDuration
	}
	return max(time.Millisecond, time.Duration(us)*time.Microsecond)
}
