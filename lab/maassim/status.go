package maassim

import (
	"fmt"
	"slices"
	"strings"
)

// Status is a MAAS NODE_STATUS code (maascommon/enums/node.py NodeStatus).
type Status int

// The NODE_STATUS codes, numbered exactly as MAAS numbers them.
const (
	StatusNew                      Status = 0
	StatusCommissioning            Status = 1
	StatusFailedCommissioning      Status = 2
	StatusMissing                  Status = 3
	StatusReady                    Status = 4
	StatusReserved                 Status = 5
	StatusDeployed                 Status = 6
	StatusRetired                  Status = 7
	StatusBroken                   Status = 8
	StatusDeploying                Status = 9
	StatusAllocated                Status = 10
	StatusFailedDeployment         Status = 11
	StatusReleasing                Status = 12
	StatusFailedReleasing          Status = 13
	StatusDiskErasing              Status = 14
	StatusFailedDiskErasing        Status = 15
	StatusRescueMode               Status = 16
	StatusEnteringRescueMode       Status = 17
	StatusFailedEnteringRescueMode Status = 18
	StatusExitingRescueMode        Status = 19
	StatusFailedExitingRescueMode  Status = 20
	StatusTesting                  Status = 21
	StatusFailedTesting            Status = 22
)

// AllStatuses lists every status in code order.
var AllStatuses = func() []Status {
	out := make([]Status, 0, 23)
	for s := StatusNew; s <= StatusFailedTesting; s++ {
		out = append(out, s)
	}
	return out
}()

// statusNames is NODE_STATUS_CHOICES (maasserver/enum.py).
var statusNames = map[Status]string{
	StatusNew:                      "New",
	StatusCommissioning:            "Commissioning",
	StatusFailedCommissioning:      "Failed commissioning",
	StatusMissing:                  "Missing",
	StatusReady:                    "Ready",
	StatusReserved:                 "Reserved",
	StatusDeployed:                 "Deployed",
	StatusRetired:                  "Retired",
	StatusBroken:                   "Broken",
	StatusDeploying:                "Deploying",
	StatusAllocated:                "Allocated",
	StatusFailedDeployment:         "Failed deployment",
	StatusReleasing:                "Releasing",
	StatusFailedReleasing:          "Releasing failed",
	StatusDiskErasing:              "Disk erasing",
	StatusFailedDiskErasing:        "Failed disk erasing",
	StatusRescueMode:               "Rescue mode",
	StatusEnteringRescueMode:       "Entering rescue mode",
	StatusFailedEnteringRescueMode: "Failed to enter rescue mode",
	StatusExitingRescueMode:        "Exiting rescue mode",
	StatusFailedExitingRescueMode:  "Failed to exit rescue mode",
	StatusTesting:                  "Testing",
	StatusFailedTesting:            "Failed testing",
}

// statusLabels are the one-word labels the machines list accepts in its
// status filter (NODE_STATUS_SHORT_LABEL_CHOICES: the enum attribute names
// lower-cased).
var statusLabels = map[Status]string{
	StatusNew:                      "new",
	StatusCommissioning:            "commissioning",
	StatusFailedCommissioning:      "failed_commissioning",
	StatusMissing:                  "missing",
	StatusReady:                    "ready",
	StatusReserved:                 "reserved",
	StatusDeployed:                 "deployed",
	StatusRetired:                  "retired",
	StatusBroken:                   "broken",
	StatusDeploying:                "deploying",
	StatusAllocated:                "allocated",
	StatusFailedDeployment:         "failed_deployment",
	StatusReleasing:                "releasing",
	StatusFailedReleasing:          "failed_releasing",
	StatusDiskErasing:              "disk_erasing",
	StatusFailedDiskErasing:        "failed_disk_erasing",
	StatusRescueMode:               "rescue_mode",
	StatusEnteringRescueMode:       "entering_rescue_mode",
	StatusFailedEnteringRescueMode: "failed_entering_rescue_mode",
	StatusExitingRescueMode:        "exiting_rescue_mode",
	StatusFailedExitingRescueMode:  "failed_exiting_rescue_mode",
	StatusTesting:                  "testing",
	StatusFailedTesting:            "failed_testing",
}

// String returns the display name MAAS uses (status_name).
func (s Status) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("Unknown(%d)", int(s))
}

// Label returns the short label accepted by the machines status filter.
func (s Status) Label() string { return statusLabels[s] }

// ParseStatusLabel maps a short label ("ready", "failed_deployment") or a
// display name back to a status.
func ParseStatusLabel(label string) (Status, bool) {
	l := strings.ToLower(strings.TrimSpace(label))
	for s, name := range statusLabels {
		if name == l || strings.ToLower(statusNames[s]) == l {
			return s, true
		}
	}
	return 0, false
}

// testingResetReady is NODE_TESTING_RESET_READY_TRANSITIONS.
var testingResetReady = []Status{
	StatusCommissioning, StatusFailedDeployment, StatusMissing, StatusRetired,
	StatusBroken, StatusFailedReleasing, StatusFailedDiskErasing,
	StatusFailedEnteringRescueMode, StatusFailedExitingRescueMode, StatusFailedTesting,
}

// transitions is NODE_TRANSITIONS from maasserver/node_status.py (MAAS
// 2.2+, the version that introduced Testing). A transition not listed here
// is a NodeStateViolation (HTTP 409) in MAAS.
var transitions = map[Status][]Status{
	StatusNew: {StatusCommissioning, StatusMissing, StatusReady, StatusRetired,
		StatusBroken, StatusEnteringRescueMode},
	StatusCommissioning: {StatusFailedCommissioning, StatusReady, StatusRetired,
		StatusMissing, StatusNew, StatusBroken, StatusTesting},
	StatusFailedCommissioning: {StatusCommissioning, StatusMissing, StatusRetired,
		StatusBroken, StatusEnteringRescueMode, StatusTesting},
	StatusReady: {StatusEnteringRescueMode, StatusCommissioning, StatusAllocated,
		StatusReserved, StatusRetired, StatusMissing, StatusBroken, StatusTesting},
	StatusReserved: {StatusReady, StatusAllocated, StatusRetired, StatusMissing,
		StatusBroken, StatusDiskErasing, StatusReleasing, StatusEnteringRescueMode,
		StatusTesting},
	StatusAllocated: {StatusReady, StatusRetired, StatusMissing, StatusBroken,
		StatusDeploying, StatusDiskErasing, StatusReleasing, StatusEnteringRescueMode,
		StatusTesting},
	StatusReleasing: {StatusAllocated, StatusReserved, StatusDeployed, StatusReady,
		StatusBroken, StatusMissing, StatusFailedDeployment, StatusFailedDiskErasing,
		StatusFailedReleasing},
	StatusDeploying: {StatusAllocated, StatusMissing, StatusBroken,
		StatusFailedDeployment, StatusDeployed, StatusReady, StatusDiskErasing,
		StatusReleasing},
	StatusFailedDeployment: {StatusAllocated, StatusMissing, StatusBroken,
		StatusReady, StatusDiskErasing, StatusReleasing, StatusEnteringRescueMode,
		StatusTesting},
	StatusDeployed: {StatusAllocated, StatusMissing, StatusBroken, StatusReady,
		StatusDiskErasing, StatusReleasing, StatusEnteringRescueMode, StatusTesting},
	StatusMissing: {StatusNew, StatusReady, StatusAllocated, StatusCommissioning,
		StatusBroken, StatusEnteringRescueMode, StatusTesting},
	StatusRetired: {StatusNew, StatusReady, StatusMissing, StatusBroken,
		StatusEnteringRescueMode, StatusTesting},
	StatusBroken: {StatusCommissioning, StatusReady, StatusDiskErasing,
		StatusReleasing, StatusEnteringRescueMode, StatusTesting},
	StatusFailedReleasing: {StatusReleasing, StatusDiskErasing, StatusReady,
		StatusBroken, StatusTesting},
	StatusDiskErasing: {StatusBroken, StatusDiskErasing, StatusFailedDiskErasing,
		StatusReady, StatusReleasing},
	StatusFailedDiskErasing: {StatusDiskErasing, StatusReleasing, StatusBroken,
		StatusAllocated, StatusReady, StatusEnteringRescueMode, StatusTesting},
	StatusEnteringRescueMode: {StatusReady, StatusBroken, StatusDeployed,
		StatusRescueMode, StatusFailedEnteringRescueMode, StatusExitingRescueMode},
	StatusFailedEnteringRescueMode: {StatusBroken, StatusEnteringRescueMode,
		StatusExitingRescueMode, StatusTesting},
	StatusRescueMode: {StatusBroken, StatusExitingRescueMode, StatusTesting},
	StatusExitingRescueMode: {StatusNew, StatusBroken, StatusFailedCommissioning,
		StatusReady, StatusReserved, StatusAllocated, StatusFailedDeployment,
		StatusDeployed, StatusMissing, StatusRetired, StatusFailedReleasing,
		StatusFailedDiskErasing, StatusRescueMode, StatusFailedEnteringRescueMode,
		StatusFailedExitingRescueMode, StatusFailedTesting},
	StatusFailedExitingRescueMode: {StatusBroken, StatusExitingRescueMode, StatusTesting},
	StatusTesting: append([]Status{StatusBroken, StatusNew, StatusReady,
		StatusReserved, StatusAllocated, StatusDeployed}, testingResetReady...),
	StatusFailedTesting: {StatusCommissioning, StatusBroken, StatusMissing,
		StatusEnteringRescueMode, StatusTesting, StatusReady, StatusDeployed},
}

// CanTransition reports whether MAAS allows a node to move from one status
// to another. Staying in the same status is always allowed (Node.clean_status
// treats "no transition" as safe).
func CanTransition(from, to Status) bool {
	if from == to {
		return true
	}
	return slices.Contains(transitions[from], to)
}

// listed reports whether to is in NODE_TRANSITIONS[from] (no same-status
// shortcut: MAAS's deploy checks membership directly).
func listed(from, to Status) bool { return slices.Contains(transitions[from], to) }

// releasableStatuses is RELEASABLE_STATUSES (maasserver/models/node.py).
var releasableStatuses = []Status{
	StatusAllocated, StatusReserved, StatusBroken, StatusDeploying, StatusDeployed,
	StatusFailedDeployment, StatusFailedDiskErasing, StatusFailedReleasing,
}

// linkAllowedStatuses are the statuses in which interface link operations
// are permitted (maasserver/api/interfaces.py ALLOWED_STATES).
var linkAllowedStatuses = []Status{
	StatusNew, StatusReady, StatusFailedTesting, StatusAllocated, StatusBroken,
}

// failureStatus is NODE_FAILURE_STATUS_TRANSITIONS.
var failureStatus = map[Status]Status{
	StatusCommissioning:      StatusFailedCommissioning,
	StatusDeploying:          StatusFailedDeployment,
	StatusReleasing:          StatusFailedReleasing,
	StatusDiskErasing:        StatusFailedDiskErasing,
	StatusEnteringRescueMode: StatusFailedEnteringRescueMode,
	StatusExitingRescueMode:  StatusFailedExitingRescueMode,
	StatusTesting:            StatusFailedTesting,
}

// IsFailed reports whether s is one of MAAS's failure statuses.
func (s Status) IsFailed() bool {
	for _, f := range failureStatus {
		if f == s {
			return true
		}
	}
	return false
}
