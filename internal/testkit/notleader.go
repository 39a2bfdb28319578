package testkit

import (
	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connectproto"
	"github.com/rationhq/ration/internal/leasewire"
)

// NotLeader is a cluster member's refusal of a lease call as the ration
// package's protocol specifies it (ReasonNotLeader): CodeUnavailable with
// an ErrorInfo naming leader, the leader's lease API base URL, or no
// leader for "". For fake members in tests of spenders that follow the
// leader.
func NotLeader(leader string) *connect.Error {
	d, err := connectproto.NewErrorDetail(leasewire.NotLeaderInfo(leader))
	if err != nil {
		panic(err) // an ErrorInfo always marshals
	}
	return connect.NewError(connect.CodeUnavailable, "not the leader").WithDetail(d)
}
