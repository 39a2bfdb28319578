// Package leasewire converts between the lease protocol's messages and
// ration's types, and builds the protocol's NOT_LEADER detail: the one
// place where the allocator, the sidecar and the simulator read and write
// them.
package leasewire

import (
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/rationhq/ration"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
)

// AmountOf reads m (nil is zero).
func AmountOf(m *leasev1.Amount) ration.Amount {
	return ration.Amount{Requests: m.GetRequests(), Tokens: m.GetTokens()}
}

// NewAmount is a on the wire, clamped to the protocol's range: an amount
// beyond it saturates rather than make the allocator refuse the whole
// call.
func NewAmount(a ration.Amount) *leasev1.Amount {
	a = a.Clamp()
	return &leasev1.Amount{Requests: a.Requests, Tokens: a.Tokens}
}

// LimitsOf reads m (nil is no limits).
func LimitsOf(m *leasev1.Limits) ration.Limits {
	return ration.Limits{RPM: m.GetRpm(), TPM: m.GetTpm(), BurstRequests: m.GetBurstRequests(), BurstTokens: m.GetBurstTokens(),
		Window: time.Duration(m.GetWindowSeconds()) * time.Second}
}

// NewLimits is l on the wire (its window in whole seconds).
func NewLimits(l ration.Limits) *leasev1.Limits {
	return &leasev1.Limits{Rpm: l.RPM, Tpm: l.TPM, BurstRequests: l.BurstRequests, BurstTokens: l.BurstTokens,
		WindowSeconds: uint32(l.Window / time.Second)}
}

// NotLeaderInfo is the detail of a cluster member's NOT_LEADER refusal
// (the ration package's ReasonNotLeader): the leader's lease API base URL
// in MetaLeader, absent ("") while the member knows none.
func NotLeaderInfo(leaderURL string) *errdetails.ErrorInfo {
	info := &errdetails.ErrorInfo{Domain: ration.ErrorDomain, Reason: ration.ReasonNotLeader}
	if leaderURL != "" {
		info.Metadata = map[string]string{ration.MetaLeader: leaderURL}
	}
	return info
}
