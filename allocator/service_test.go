package allocator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connectproto"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/cluster"
	"github.com/rationhq/ration/allocator/ledger"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
)

func TestErrorTable(t *testing.T) {
	for _, tc := range []struct {
		err    error
		code   connect.Code
		msg    string
		detail string // the BadRequest field or ErrorInfo reason (and metadata) the spender reads
	}{
		{&ledger.InputError{Field: "keys[3].want.tokens", Reason: "-1 outside [0, 9]"}, connect.CodeInvalidArgument, "allocator: keys[3].want.tokens: -1 outside [0, 9]", "keys[3].want.tokens"},
		{fmt.Errorf("x: %w", ledger.ErrStaleSequence), connect.CodeFailedPrecondition, "x: stale sequence", ration.ReasonStaleSequence},
		{fmt.Errorf("x: %w", ledger.ErrSequenceReused), connect.CodeFailedPrecondition, "x: sequence reused with a different request", ration.ReasonSequenceReused},
		{fmt.Errorf("x: %w", ledger.ErrStaleEpoch), connect.CodeFailedPrecondition, "x: stale epoch", ration.ReasonStaleEpoch},
		{fmt.Errorf("x: %w", &ledger.StaleEpochError{Latest: 42}), connect.CodeFailedPrecondition, "x: stale epoch (the latest seen is 42)", ration.ReasonStaleEpoch + " 42"},
		{fmt.Errorf("x: %w", ledger.ErrEpochReleased), connect.CodeFailedPrecondition, "x: epoch released", ration.ReasonEpochReleased},
		{fmt.Errorf("x: %w", ledger.ErrForeignSpender), connect.CodePermissionDenied, "x: spender id belongs to another credential", ""},
		{fmt.Errorf("x: %w", &ledger.QuotaError{What: "keys", Limit: 9}), connect.CodeResourceExhausted,
			"x: resource exhausted: the call would take this credential's keys beyond its quota of 9", ""},
		{&cluster.NotLeaderError{URL: "https://b.example:7450"}, connect.CodeUnavailable, "allocator: not the leader; send the same call to the leader", ration.ReasonNotLeader + " https://b.example:7450"},
		{&cluster.NotLeaderError{}, connect.CodeUnavailable, "allocator: not the leader; send the same call to the leader", ration.ReasonNotLeader},
		{&cluster.NotLeaderError{URL: "http://c:1", Unknown: true}, connect.CodeUnavailable, "allocator: leadership lost with the call in flight; send the same call to the leader", ration.ReasonNotLeader + " http://c:1"},
		{fmt.Errorf("%w: %w", cluster.ErrOutcomeUnknown, context.DeadlineExceeded), connect.CodeUnavailable, "allocator: outcome unknown; retry the same call", ""},
		{fmt.Errorf("%w: %w", ErrClosed, cluster.ErrClosed), connect.CodeUnavailable, "allocator: shutting down", ""},
		{ErrClosed, connect.CodeUnavailable, "allocator: shutting down", ""},
		{fmt.Errorf("%w: disk full", ErrNotDurable), connect.CodeUnavailable, "allocator: store unavailable; retry the same call", ""},
		{fmt.Errorf("%w by 5s (a leader waits 1s at most)", ErrClockBehind), connect.CodeUnavailable, "allocator: the leader's clock is behind the ledger's; retry the same call", ""},
		{context.Canceled, connect.CodeCanceled, "allocator: canceled", ""},
		{&AbandonedError{Err: context.Canceled, Applied: true}, connect.CodeCanceled, "allocator: canceled", ""},
		{&AbandonedError{Err: context.DeadlineExceeded}, connect.CodeDeadlineExceeded, "allocator: deadline exceeded", ""},
		{&AbandonedError{Err: context.DeadlineExceeded, Unknown: true}, connect.CodeUnavailable, "allocator: outcome unknown; retry the same call", ""},
		{context.DeadlineExceeded, connect.CodeDeadlineExceeded, "allocator: deadline exceeded", ""},
		{errors.New("secret detail"), connect.CodeInternal, "allocator: internal error", ""},
	} {
		ce := codeOf(tc.err)
		if ce.Code() != tc.code || ce.Message() != tc.msg {
			t.Errorf("codeOf(%v) = %v %q, want %v %q", tc.err, ce.Code(), ce.Message(), tc.code, tc.msg)
		}
		if !errors.Is(ce, tc.err) {
			t.Errorf("codeOf(%v) lost its cause", tc.err)
		}
		if got := detailText(t, ce); got != tc.detail {
			t.Errorf("codeOf(%v) detail %q, want %q", tc.err, got, tc.detail)
		}
	}
}

// detailText is ce's detail as the table states it: a BadRequest's field,
// or an ErrorInfo's reason and latest epoch.
func detailText(t *testing.T, ce *connect.Error) string {
	var out []string
	for _, d := range ce.Details() {
		m, err := connectproto.UnmarshalErrorDetail(d)
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *errdetails.BadRequest:
			for _, v := range m.GetFieldViolations() {
				out = append(out, v.GetField())
			}
		case *errdetails.ErrorInfo:
			if m.GetDomain() != ration.ErrorDomain {
				t.Errorf("ErrorInfo domain %q", m.GetDomain())
			}
			out = append(out, m.GetReason())
			if e, ok := m.GetMetadata()[ration.MetaLatestEpoch]; ok {
				out = append(out, e)
			}
			if u, ok := m.GetMetadata()[ration.MetaLeader]; ok {
				out = append(out, u)
			}
		}
	}
	return strings.Join(out, " ")
}

// The in-process Service answers with the same codes as the network.
func TestServiceErrorsAreConnectErrors(t *testing.T) {
	l := newLedger(t, newFakeClock())
	s := NewService(l)
	_, err := s.Acquire(ctx, &leasev1.AcquireRequest{})
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("empty request: %v", err)
	}
	req := &leasev1.AcquireRequest{Caller: &leasev1.Caller{SpenderId: "a", Epoch: 1, Sequence: 2},
		Keys: []*leasev1.KeyAcquire{{Key: "k", Limits: &leasev1.Limits{Tpm: 60}}}}
	if _, err := s.Acquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	req.Caller.Sequence = 1
	if _, err := s.Acquire(ctx, req); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("stale: %v", err)
	}
	l.Close()
	req.Caller.Sequence = 3
	if _, err := s.ReserveAhead(ctx, &leasev1.ReserveAheadRequest{Caller: req.Caller,
		Keys: []*leasev1.KeyReserve{{Key: "k", Limits: &leasev1.Limits{Tpm: 60}}}}); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("closed: %v", err)
	}
	if _, err := s.Release(ctx, &leasev1.ReleaseRequest{Caller: req.Caller}); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("closed release: %v", err)
	}
}

func TestServiceReserveAheadAndRelease(t *testing.T) {
	clk := newFakeClock()
	l := newLedger(t, clk)
	s := NewService(l)
	lim := &leasev1.Limits{Rpm: 600, Tpm: 600}
	c := func(seq uint64) *leasev1.Caller { return &leasev1.Caller{SpenderId: "a", Epoch: 1, Sequence: seq} }
	if _, err := s.Acquire(ctx, &leasev1.AcquireRequest{Caller: c(1), Keys: []*leasev1.KeyAcquire{
		{Key: "k", Limits: lim, Want: &leasev1.Amount{Tokens: 600}}}}); err != nil {
		t.Fatal(err)
	}
	r, err := s.ReserveAhead(ctx, &leasev1.ReserveAheadRequest{Caller: c(2), Keys: []*leasev1.KeyReserve{
		{Key: "k", Limits: lim, Cost: &leasev1.Amount{Requests: 1, Tokens: 50}, MaxWaitUs: 10_000_000},
		{Key: "j", Limits: lim, Cost: &leasev1.Amount{Requests: 1, Tokens: 700}, MaxWaitUs: 10_000_000},
	}})
	if err != nil {
		t.Fatal(err)
	}
	k := r.GetKeys()[0]
	if k.GetStatus() != leasev1.GrantStatus_GRANT_STATUS_OK || k.GetWaitUs() != 5_000_000 || k.GetHeld().GetTokens() != 650 ||
		k.GetSnapshot().GetTokens().GetLimit() != 600 || k.GetActiveSpenders() != 1 || r.GetLeaseTtlUs() != 10_000_000 {
		t.Fatalf("reservation: %v", r)
	}
	if r.GetKeys()[1].GetStatus() != leasev1.GrantStatus_GRANT_STATUS_TOO_LARGE {
		t.Fatalf("too large: %v", r.GetKeys()[1])
	}
	for _, w := range []int64{-1, 3_600_000_001, 1 << 62} {
		_, err := s.ReserveAhead(ctx, &leasev1.ReserveAheadRequest{Caller: c(3), Keys: []*leasev1.KeyReserve{{Key: "k", Limits: lim, MaxWaitUs: w}}})
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "max_wait_us: must be 0 to 3600000000 µs") {
			t.Fatalf("max_wait_us %d: %v", w, err)
		}
	}
	rel, err := s.Release(ctx, &leasev1.ReleaseRequest{Caller: c(3), Keys: []*leasev1.KeyRelease{
		{Key: "k", Limits: lim, Returned: &leasev1.Amount{Tokens: 1000}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := rel.GetReturned()[0].GetTokens(); got != 650 {
		t.Fatalf("release credited %d, want 650 (capped at the holding)", got)
	}
}
