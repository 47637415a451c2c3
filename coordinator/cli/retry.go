package cli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// Retrying through a failover. A coordinator answers 503 (unavailable or
// not_leader) with Retry-After while no leader is reachable: during an
// election, or from a replica cut off from the majority. gpuaasctl sends
// such a request again — after Retry-After, within the command's
// --timeout — only where that is safe: reads, and writes that carry an
// Idempotency-Key (alloc create always does; the coordinator answers a
// re-sent key with the first outcome). Any other write's 503 is shown as
// is: its outcome may be unknown, and the detail says so.

// maxRetryAfter caps how long one Retry-After makes the CLI wait.
const maxRetryAfter = 5 * time.Second

// minRetryWait is the least wait between two attempts (Retry-After: 0).
const minRetryWait = 100 * time.Millisecond

// retriable reports whether err is a 503 worth sending the request again
// for, and how long to wait first.
func retriable(err error) (time.Duration, bool) {
	var pe *ProblemError
	if !errors.As(err, &pe) || pe.Status != http.StatusServiceUnavailable ||
		(pe.Code != proto.CodeUnavailable && pe.Code != proto.CodeNotLeader) || behindMinIndex(err) {
		return 0, false
	}
	wait := time.Second
	if n, err := strconv.Atoi(pe.RetryAfter); err == nil && n >= 0 {
		wait = min(max(time.Duration(n)*time.Second, minRetryWait), maxRetryAfter)
	}
	return wait, true
}

// safeToRetry reports whether sending the request again cannot apply a
// write twice.
func safeToRetry(method string, hdr http.Header) bool {
	return method == http.MethodGet || method == http.MethodHead || hdr.Get(proto.IdempotencyKeyHeader) != ""
}

// retryLoop runs do until it succeeds, fails for good, or ctx ends,
// telling the user about each retry.
func (a *app) retryLoop(ctx context.Context, method string, hdr http.Header, do func() (*Response, error)) (*Response, error) {
	for {
		r, err := do()
		if err == nil || !safeToRetry(method, hdr) {
			return r, err
		}
		wait, ok := retriable(err)
		if !ok {
			return r, err
		}
		if dl, has := ctx.Deadline(); has && time.Until(dl) < wait {
			return r, err
		}
		what := "retrying"
		if hdr.Get(proto.IdempotencyKeyHeader) != "" {
			what = "retrying with the same idempotency key"
		}
		var pe *ProblemError
		errors.As(err, &pe)
		fmt.Fprintf(a.errOut, "coordinator unavailable (%s); %s in %s\n", pe.Detail, what, wait)
		select {
		case <-ctx.Done():
			return r, err
		case <-time.After(wait):
		}
	}
}
