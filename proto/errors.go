package proto

import (
	"errors"
	"fmt"
	"net/http"
)

// Code is a stable machine-readable error code. The API returns it in the
// "code" member of an application/problem+json body; clients branch on it.
// Codes are never renamed.
type Code string

const (
	CodeInvalidArgument   Code = "invalid_argument"   // malformed or out-of-range input
	CodeNotFound          Code = "not_found"          // no such object
	CodeConflict          Code = "conflict"           // optimistic-concurrency check failed; retry with fresh state
	CodeIllegalTransition Code = "illegal_transition" // state machine refuses the change
	CodeNoCapacity        Code = "no_capacity"        // placement found nothing; detail says why
	CodeAlreadyExists     Code = "already_exists"     // create of an existing object
	CodeUnauthenticated   Code = "unauthenticated"    // no or bad bearer token
	CodeForbidden         Code = "forbidden"          // token lacks the role
	CodeNotLeader         Code = "not_leader"         // write reached a follower that could not forward
	CodeUnavailable       Code = "unavailable"        // no leader, shutting down
	CodeTooLarge          Code = "too_large"          // request body over the limit
	CodeInternal          Code = "internal"
	// CodeMethodNotAllowed: the route exists but not for this HTTP method.
	CodeMethodNotAllowed Code = "method_not_allowed"
	// CodeUnsupportedMediaType: a request body whose Content-Type is not
	// the route's (application/json for JSON bodies).
	CodeUnsupportedMediaType Code = "unsupported_media_type"
	// CodeRateLimited: too many requests (or failed authentications) from
	// one address or principal; the Retry-After header says when to retry.
	CodeRateLimited Code = "rate_limited"
)

// HTTPStatus maps a code to its HTTP status.
func (c Code) HTTPStatus() int {
	switch c {
	case CodeInvalidArgument:
		return http.StatusBadRequest
	case CodeNotFound:
		return http.StatusNotFound
	case CodeConflict, CodeIllegalTransition, CodeAlreadyExists:
		return http.StatusConflict
	case CodeNoCapacity:
		return http.StatusUnprocessableEntity
	case CodeUnauthenticated:
		return http.StatusUnauthorized
	case CodeForbidden:
		return http.StatusForbidden
	case CodeNotLeader, CodeUnavailable:
		return http.StatusServiceUnavailable
	case CodeTooLarge:
		return http.StatusRequestEntityTooLarge
	case CodeMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case CodeUnsupportedMediaType:
		return http.StatusUnsupportedMediaType
	case CodeRateLimited:
		return http.StatusTooManyRequests
	default:
		return http.StatusInternalServerError
	}
}

// Error is a domain error with a stable code. FSM apply functions return it
// as the Apply response; the API renders it as a problem response.
type Error struct {
	Code   Code   `json:"code"`
	Detail string `json:"detail"`
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Detail }

// Errorf builds an *Error.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Detail: fmt.Sprintf(format, args...)}
}

// CodeOf returns the code of err, or CodeInternal if err carries none.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}
