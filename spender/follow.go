package spender

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"

	"connectrpc.com/connect/v2"

	"github.com/rationhq/ration/internal/memberurl"
	leasev1 "github.com/rationhq/ration/proto/ration/lease/v1"
	"github.com/rationhq/ration/proto/ration/lease/v1/leasev1connect"
)

// maxRedirects bounds how often one attempt is sent on to the leader a
// member named. Raft followers name the leader they last heard from, so
// one redirect reaches it; the second covers a leader that changed while
// the first was in flight. Members that name each other (a stale view
// during an election, or a misconfigured advertised URL) then cost at most
// 1+maxRedirects round trips before the attempt fails and the Limiter
// backs off.
const maxRedirects = 2

// follower is the LeaseSource DialAllocator returns: one connect client
// per member of the allocator cluster (one member for a lone allocator).
// A call goes to the member that answered last. A member that is not the
// leader answers NOT_LEADER (see the ration package's ReasonNotLeader);
// when it names a listed member, the same request (same epoch, sequence
// and body) goes there at once, within the same attempt. When it names no
// one, names a URL outside the list, or the member cannot be reached, the
// attempt fails with that error and the next call starts at the next
// member: the Limiter retries the call with backoff, as in an outage.
//
// It is safe for concurrent use (several Limiters may share one).
type follower struct {
	members []member
	index   map[string]int // members' keys (memberurl.Key) to their index

	// next is the member a call is sent to first: the last one that
	// answered, or the one after the first member of a call that failed.
	next atomic.Int32

	metrics *Metrics     // nil records nothing
	log     *slog.Logger // never nil

	mu     sync.Mutex // guards leader and warned, and orders the leader gauge's updates
	leader int        // the member that answered last; -1 before any answer
	warned string     // the last leader URL outside the list that was logged
}

// member is one allocator the follower may call.
type member struct {
	url    string // the member's key (memberurl.Key): for logs, metrics and matching
	client leasev1connect.LeaseServiceClient
}

var _ LeaseSource = (*follower)(nil)

func (f *follower) Acquire(ctx context.Context, r *leasev1.AcquireRequest) (*leasev1.AcquireResponse, error) {
	return follow(ctx, f, r, leasev1connect.LeaseServiceClient.Acquire)
}

func (f *follower) ReserveAhead(ctx context.Context, r *leasev1.ReserveAheadRequest) (*leasev1.ReserveAheadResponse, error) {
	return follow(ctx, f, r, leasev1connect.LeaseServiceClient.ReserveAhead)
}

func (f *follower) Release(ctx context.Context, r *leasev1.ReleaseRequest) (*leasev1.ReleaseResponse, error) {
	return follow(ctx, f, r, leasev1connect.LeaseServiceClient.Release)
}

// follow makes one attempt of a call: it sends req to the member f.next
// names and on to the leader a NOT_LEADER answer names, at most
// maxRedirects times. It returns the last answer: a reply or refusal from
// the member that serves (which the next call starts at), or the failure
// that ended the attempt (and the next call starts one member further).
func follow[Req, Resp any](ctx context.Context, f *follower, req Req, send func(leasev1connect.LeaseServiceClient, context.Context, Req) (Resp, error)) (Resp, error) {
	start := f.next.Load()
	i := int(start)
	for hops := 0; ; hops++ {
		resp, err := send(f.members[i].client, ctx, req)
		if !unreachable(err) {
			f.answered(i)
			return resp, err
		}
		if ctx.Err() == nil {
			if j := f.redirect(i, err, hops); j >= 0 {
				i = j
				continue
			}
		}
		// Another call may have found the leader meanwhile: move on only
		// from where this one started.
		f.next.CompareAndSwap(start, (start+1)%int32(len(f.members)))
		return resp, err
	}
}

// unreachable reports whether err means the member did not serve the
// call: it could not be reached, did not answer within the attempt, or is
// not the leader (NOT_LEADER is CodeUnavailable). Nothing was applied by
// that member, or the Limiter's retry with the same sequence is answered
// from the stored reply.
func unreachable(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeCanceled:
		return err != nil
	}
	return false
}

// redirect returns the member to send the call to next when member i's
// failure err is a NOT_LEADER naming another listed member and the call
// has been redirected fewer than maxRedirects times; else -1.
func (f *follower) redirect(i int, err error, hops int) int {
	leader, ok := notLeader(err)
	if !ok || leader == "" {
		return -1
	}
	j, listed := f.lookup(leader)
	switch {
	case !listed:
		f.metrics.redirect(redirectOutside)
		f.warnOutside(i, leader)
		return -1
	case j == i: // a member naming itself knows no leader it can serve as
		return -1
	case hops >= maxRedirects:
		f.metrics.redirect(redirectLimit)
		return -1
	}
	f.metrics.redirect(redirectFollowed)
	return j
}

// lookup finds the member whose URL is raw, compared as memberurl.Key does.
func (f *follower) lookup(raw string) (int, bool) {
	u, err := url.Parse(raw)
	if err != nil {
		return 0, false
	}
	i, ok := f.index[memberurl.Key(u)]
	return i, ok
}

// answered records that member i served a call: the next call starts
// there, and a change of leader is logged and shown in the metrics.
func (f *follower) answered(i int) {
	f.next.Store(int32(i))
	f.mu.Lock()
	prev, changed := f.leader, f.leader != i
	if changed {
		f.leader = i
		f.metrics.setLeader(f.members[i].url, f.memberURL(prev))
	}
	f.mu.Unlock()
	switch {
	case changed && prev < 0:
		f.log.Info("spender: allocator answering", "member", f.members[i].url)
	case changed:
		f.log.Info("spender: following a new allocator leader", "leader", f.members[i].url, "previous", f.members[prev].url)
	}
}

// memberURL is member i's URL, "" for -1.
func (f *follower) memberURL(i int) string {
	if i < 0 {
		return ""
	}
	return f.members[i].url
}

// warnOutside logs, once per URL in a row, a leader URL that member i
// named and that is not in the list (the call is not sent there: the
// bearer token goes only to listed members).
func (f *follower) warnOutside(i int, leader string) {
	f.mu.Lock()
	repeat := f.warned == leader
	f.warned = leader
	f.mu.Unlock()
	if !repeat {
		f.log.Warn("spender: an allocator member named a leader that is not in the configured list; not following it (list every member, with the URL each advertises)",
			"member", f.members[i].url, "leader", leader)
	}
}

// parseMembers splits list, one allocator base URL or several
// comma-separated, into the members' base URLs (without a trailing slash)
// and their keys. Every URL is http:// or https:// with a host, all share
// one scheme, and none is listed twice.
func parseMembers(list string) (bases, keys []string, err error) {
	for raw := range strings.SplitSeq(list, ",") {
		raw = strings.TrimSpace(raw)
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, nil, fmt.Errorf("spender: allocator URL %q: want http://host:port or https://host:port (several comma-separated for a cluster)", raw)
		}
		if len(bases) > 0 && !strings.HasPrefix(keys[0], u.Scheme+"://") {
			return nil, nil, fmt.Errorf("spender: allocator URLs %q: every member must use the same scheme", list)
		}
		key := memberurl.Key(u)
		for _, k := range keys {
			if k == key {
				return nil, nil, fmt.Errorf("spender: allocator URLs %q: %s is listed twice", list, key)
			}
		}
		bases, keys = append(bases, strings.TrimSuffix(raw, "/")), append(keys, key)
	}
	return bases, keys, nil
}
