package proto

import (
	"fmt"
	"regexp"
)

// MaxIDLength bounds every identifier the API accepts.
const MaxIDLength = 128

var idPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)

// ValidateID checks that s is a well-formed identifier of the kind named by
// what (used in the error): 1 to MaxIDLength characters of [a-z0-9._-],
// starting with a letter or digit.
func ValidateID(what, s string) error {
	switch {
	case s == "":
		return Errorf(CodeInvalidArgument, "%s is required", what)
	case len(s) > MaxIDLength:
		return Errorf(CodeInvalidArgument, "%s is %d characters long; at most %d are allowed", what, len(s), MaxIDLength)
	case !idPattern.MatchString(s):
		return Errorf(CodeInvalidArgument, "%s %q is not a valid identifier (lowercase letters, digits, '.', '_' and '-', starting with a letter or digit)", what, s)
	}
	return nil
}

// SlotID names slot index i of node: "<node>-s<i>".
func SlotID(node string, i int) string { return fmt.Sprintf("%s-s%d", node, i) }
