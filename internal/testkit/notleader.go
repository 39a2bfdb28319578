package testkit

import (
	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connectproto"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/rationhq/ration"
)

// NotLeader is a cluster member's refusal of a lease call as the ration
// package's protocol specifies it (ReasonNotLeader): CodeUnavailable with
// an ErrorInfo naming leader, the leader's lease API base URL, or no
// leader for "". For fake members in tests of spenders that follow the
// leader.
func NotLeader(leader string) *connect.Error {
	info := &errdetails.ErrorInfo{Domain: ration.ErrorDomain, Reason: ration.ReasonNotLeader}
	if leader != "" {
		info.Metadata = map[string]string{ration.MetaLeader: leader}
	}
	d, err := connectproto.NewErrorDetail(info)
	if err != nil {
		panic(err) // an ErrorInfo always marshals
	}
	return connect.NewError(connect.CodeUnavailable, "not the leader").WithDetail(d)
}
