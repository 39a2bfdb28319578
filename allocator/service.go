package allocator

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connectproto"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"

	"github.com/rationhq/ration"
	"github.com/rationhq/ration/allocator/cluster"
	"github.com/rationhq/ration/allocator/ledger"
	"github.com/rationhq/ration/internal/leasewire"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/proto/ration/lease/v1/leasev1connect"
)

// Service is the LeaseService over a Ledger. It is the connect handler
// (register it with leasev1connect.RegisterLeaseServiceHandler) and the
// in-process entry point: its methods have the same signatures and
// semantics as the generated leasev1connect.LeaseServiceClient, errors
// included (*connect.Error with the codes of codeOf), so a spender can be
// given a *Service where it expects a client. It is safe for concurrent use.
type Service struct {
	l   *Ledger
	m   *Metrics
	log *slog.Logger

	// replies holds Acquire reply buffers (*pooledReply) that Mount's
	// calls gave back (see replyHolder).
	replies sync.Pool
	// keys holds Acquire's converted request keys (*[]ledger.AcquireKey),
	// given back by the calls that succeeded: the ledger keeps nothing of
	// them once it has answered (a failed call's may still be in a
	// cluster's queue, abandoned by its caller).
	keys sync.Pool
}

var _ leasev1connect.LeaseServiceHandler = (*Service)(nil)
var _ leasev1connect.LeaseServiceClient = (*Service)(nil)

// ServiceOption configures a Service.
type ServiceOption interface{ applyService(*Service) }

type serviceOptionFunc func(*Service)

func (f serviceOptionFunc) applyService(s *Service) { f(s) }

// WithMetrics records calls, grants, returns and rejections in m; default none.
func WithMetrics(m *Metrics) ServiceOption { return serviceOptionFunc(func(s *Service) { s.m = m }) }

// WithServiceLogger sets the logger for internal errors; default discards.
func WithServiceLogger(l *slog.Logger) ServiceOption {
	return serviceOptionFunc(func(s *Service) { s.log = l })
}

// NewService returns the LeaseService over l.
func NewService(l *Ledger, opts ...ServiceOption) *Service {
	s := &Service{l: l, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o.applyService(s)
	}
	return s
}

// Acquire implements LeaseService.Acquire.
func (s *Service) Acquire(ctx context.Context, req *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	start := time.Now()
	kp, _ := s.keys.Get().(*[]ledger.AcquireKey)
	if kp == nil {
		kp = new([]ledger.AcquireKey)
	}
	keys := acquireKeysOf(*kp, req)
	r, err := s.l.acquire(ctx, callerOf(ctx, req.GetCaller()), keys)
	if err != nil {
		return nil, s.fail("Acquire", start, err)
	}
	s.m.acquired(keys, r)
	if cap(keys) <= maxPooledKeys {
		clear(keys) // drop the request's strings
		*kp = keys[:0]
		s.keys.Put(kp)
	}
	s.m.call("Acquire", start, nil)
	return acquireResponseOf(r, s.replyBuf(ctx, len(r.Keys))), nil
}

// maxPooledKeys bounds the replies kept in the pool, in keys, so that a
// rare large call does not pin its buffer.
const maxPooledKeys = 256

// replyBuf returns a buffer for an Acquire reply of n keys: from the pool
// when the call came through Mount (which puts it back once the reply is
// written), a new one otherwise (the caller keeps the reply).
func (s *Service) replyBuf(ctx context.Context, n int) *acquireBuf {
	hd := holderOf(ctx)
	if hd == nil || n > maxPooledKeys {
		return newAcquireBuf(n)
	}
	p, _ := s.replies.Get().(*pooledReply)
	if p == nil {
		p = &pooledReply{buf: newAcquireBuf(n), pool: &s.replies}
	}
	if !hd.leave(p) {
		return newAcquireBuf(n) // p is dropped: the holder is closed or full
	}
	return p.buf
}

// AtQuota reports whether credential cred's last Acquire or ReserveAhead
// was refused for its quota (Ledger.AtQuota): Mount then refuses its calls
// before reading them.
func (s *Service) AtQuota(cred string) bool { return s.l.AtQuota(cred) }

// ReserveAhead implements LeaseService.ReserveAhead.
func (s *Service) ReserveAhead(ctx context.Context, req *leasev1.ReserveAheadRequest) (*leasev1.ReserveAheadResponse, error) {
	start := time.Now()
	keys := reserveKeysOf(req)
	r, err := s.l.ReserveAhead(ctx, callerOf(ctx, req.GetCaller()), keys)
	if err != nil {
		return nil, s.fail("ReserveAhead", start, err)
	}
	s.m.reserved(keys, r)
	s.m.call("ReserveAhead", start, nil)
	return reserveResponseOf(r), nil
}

// Release implements LeaseService.Release.
func (s *Service) Release(ctx context.Context, req *leasev1.ReleaseRequest) (*leasev1.ReleaseResponse, error) {
	start := time.Now()
	r, err := s.l.Release(ctx, callerOf(ctx, req.GetCaller()), releaseKeysOf(req))
	if err != nil {
		return nil, s.fail("Release", start, err)
	}
	s.m.released(r)
	s.m.call("Release", start, nil)
	return releaseResponseOf(r), nil
}

func (s *Service) fail(method string, start time.Time, err error) error {
	ce := codeOf(err)
	switch {
	case errors.Is(err, cluster.ErrNotLeader) && !errors.Is(err, cluster.ErrOutcomeUnknown):
		// A follower's normal answer: the spender goes to the leader.
		s.log.Debug("allocator: not the leader", "method", method, "err", err)
	case ce.Code() == connect.CodeInternal || ce.Code() == connect.CodeUnavailable:
		s.log.Error("allocator: call failed", "method", method, "err", err)
	}
	s.m.call(method, start, ce)
	return ce
}

// codeOf is the one table from ledger errors to connect codes. The message
// is public (it reaches the spender); internal detail travels only as the
// cause. A refusal the spender acts on also carries a detail (see the
// ration package's ErrorDomain): the field of an InvalidArgument, the
// reason of a FailedPrecondition. See docs/allocator.md "Errors".
//
//	ErrInvalidArgument (an *InputError)    InvalidArgument    "allocator: keys[3].want.tokens: ..."
//	ErrStaleSequence, ErrSequenceReused,
//	ErrStaleEpoch, ErrEpochReleased        FailedPrecondition  names spender, epoch, sequence
//	ErrForeignSpender                      PermissionDenied    names the spender id
//	ErrResourceExhausted (a *QuotaError)   ResourceExhausted   names the quota
//	*cluster.NotLeaderError (a cluster
//	member that is not the leader)         Unavailable         ErrorInfo NOT_LEADER, metadata leader = its API URL (when known)
//	cluster.ErrOutcomeUnknown              Unavailable         retry the same call
//	ErrClosed, ErrNotDurable               Unavailable         retry the same call
//	context.Canceled / DeadlineExceeded    Canceled / DeadlineExceeded
//	anything else                          Internal            "allocator: internal error"
func codeOf(err error) *connect.Error {
	var ce *connect.Error
	var ie *ledger.InputError
	var nle *cluster.NotLeaderError
	switch {
	case errors.As(err, &ce):
		return ce
	case errors.As(err, &ie):
		return withDetail(connect.NewError(connect.CodeInvalidArgument, err.Error()).WithCause(err),
			&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: ie.Field, Description: ie.Reason}}})
	case errors.Is(err, ledger.ErrStaleSequence), errors.Is(err, ledger.ErrSequenceReused),
		errors.Is(err, ledger.ErrStaleEpoch), errors.Is(err, ledger.ErrEpochReleased):
		return withDetail(connect.NewError(connect.CodeFailedPrecondition, err.Error()).WithCause(err), refusal(err))
	case errors.Is(err, ledger.ErrInvalidArgument):
		return connect.NewError(connect.CodeInvalidArgument, err.Error()).WithCause(err)
	case errors.Is(err, ledger.ErrForeignSpender):
		return connect.NewError(connect.CodePermissionDenied, err.Error()).WithCause(err)
	case errors.Is(err, ledger.ErrResourceExhausted):
		return connect.NewError(connect.CodeResourceExhausted, err.Error()).WithCause(err)
	case errors.As(err, &nle):
		msg := "allocator: not the leader; send the same call to the leader"
		if nle.Unknown {
			msg = "allocator: leadership lost with the call in flight; send the same call to the leader"
		}
		return withDetail(connect.NewError(connect.CodeUnavailable, msg).WithCause(err), leasewire.NotLeaderInfo(nle.URL))
	case errors.Is(err, cluster.ErrOutcomeUnknown):
		// Before the context cases: a wait that ended with its context
		// still left an entry that may be applied.
		return connect.NewError(connect.CodeUnavailable, "allocator: outcome unknown; retry the same call").WithCause(err)
	case errors.Is(err, ErrClockBehind):
		return connect.NewError(connect.CodeUnavailable, "allocator: the leader's clock is behind the ledger's; retry the same call").WithCause(err)
	case errors.Is(err, ErrClosed):
		return connect.NewError(connect.CodeUnavailable, "allocator: shutting down").WithCause(err)
	case errors.Is(err, ErrNotDurable):
		return connect.NewError(connect.CodeUnavailable, "allocator: store unavailable; retry the same call").WithCause(err)
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, "allocator: canceled").WithCause(err)
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, "allocator: deadline exceeded").WithCause(err)
	}
	return connect.NewError(connect.CodeInternal, "allocator: internal error").WithCause(err)
}

// refusal is the ErrorInfo of a call refused for its epoch or sequence.
func refusal(err error) *errdetails.ErrorInfo {
	info := &errdetails.ErrorInfo{Domain: ration.ErrorDomain}
	var se *ledger.StaleEpochError
	switch {
	case errors.As(err, &se):
		info.Reason = ration.ReasonStaleEpoch
		info.Metadata = map[string]string{ration.MetaLatestEpoch: strconv.FormatUint(se.Latest, 10)}
	case errors.Is(err, ledger.ErrStaleEpoch):
		info.Reason = ration.ReasonStaleEpoch
	case errors.Is(err, ledger.ErrStaleSequence):
		info.Reason = ration.ReasonStaleSequence
	case errors.Is(err, ledger.ErrSequenceReused):
		info.Reason = ration.ReasonSequenceReused
	default:
		info.Reason = ration.ReasonEpochReleased
	}
	return info
}

// withDetail adds msg to ce as an error detail (it always marshals).
func withDetail(ce *connect.Error, msg proto.Message) *connect.Error {
	if d, err := connectproto.NewErrorDetail(msg); err == nil {
		ce = ce.WithDetail(d)
	}
	return ce
}
