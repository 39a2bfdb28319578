package spender

import (
	"errors"
	"strconv"
	"strings"

	"connectrpc.com/connect/v2"
	"connectrpc.com/connect/v2/connectproto"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/rationhq/ration"
)

// refusedKey reads an InvalidArgument refusal's field (see the ration
// package's ErrorDomain): when it is inside entry i of a call of n keys,
// it returns i and the reason without the index ("limits.rpm: ...").
func refusedKey(err error, n int) (i int, reason string, ok bool) {
	for _, m := range details(err) {
		br, isBR := m.(*errdetails.BadRequest)
		if !isBR {
			continue
		}
		for _, v := range br.GetFieldViolations() {
			rest, found := strings.CutPrefix(v.GetField(), "keys[")
			if !found {
				continue
			}
			idx, field, found := strings.Cut(rest, "].")
			i, err := strconv.Atoi(idx)
			if !found || err != nil || i < 0 || i >= n {
				continue
			}
			return i, field + ": " + v.GetDescription(), true
		}
	}
	return 0, "", false
}

// refusedField is the field an InvalidArgument refusal names first ("" if
// it names none).
func refusedField(err error) string {
	for _, m := range details(err) {
		if br, ok := m.(*errdetails.BadRequest); ok && len(br.GetFieldViolations()) > 0 {
			return br.GetFieldViolations()[0].GetField()
		}
	}
	return ""
}

// refusedEpoch reads a FailedPrecondition refusal: ok when the call's
// epoch is stale, with the latest epoch the allocator has seen for our id.
func refusedEpoch(err error) (latest uint64, ok bool) {
	for _, m := range details(err) {
		info, isInfo := m.(*errdetails.ErrorInfo)
		if !isInfo || info.GetDomain() != ration.ErrorDomain || info.GetReason() != ration.ReasonStaleEpoch {
			continue
		}
		latest, _ = strconv.ParseUint(info.GetMetadata()[ration.MetaLatestEpoch], 10, 64)
		return latest, true
	}
	return 0, false
}

// notLeader reads an Unavailable refusal from a cluster member that is
// not the leader: ok when err carries ReasonNotLeader, with the leader's
// base URL as the member gave it ("" while the member knows no leader).
func notLeader(err error) (leader string, ok bool) {
	if connect.CodeOf(err) != connect.CodeUnavailable {
		return "", false
	}
	for _, m := range details(err) {
		info, isInfo := m.(*errdetails.ErrorInfo)
		if !isInfo || info.GetDomain() != ration.ErrorDomain || info.GetReason() != ration.ReasonNotLeader {
			continue
		}
		return info.GetMetadata()[ration.MetaLeader], true
	}
	return "", false
}

// details decodes a connect error's details; undecodable ones are skipped.
func details(err error) []any {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil
	}
	var out []any
	for _, d := range ce.Details() {
		if m, err := connectproto.UnmarshalErrorDetail(d); err == nil {
			out = append(out, m)
		}
	}
	return out
}
