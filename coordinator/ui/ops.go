package ui

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/cli"
	"github.com/gpuaas/gpuaas/proto"
)

// ---- overview ----

type regionOverview struct {
	Region    proto.Region
	Avail     []*proto.Availability
	Slots     map[proto.SlotStatus]int
	Nodes     int
	NodesBy   map[proto.NodeState]int
	Unhealthy int
}

type overviewData struct {
	Regions     []*regionOverview
	SlotStates  []proto.SlotStatus
	Peers       []peerView
	Status      proto.Status
	Agents      map[string]string
	NodesByMode map[string]int
	Truncated   bool
}

var slotStates = []proto.SlotStatus{proto.SlotAvailable, proto.SlotAllocated, proto.SlotReserved, proto.SlotReleasing,
	proto.SlotCleanupBlocked, proto.SlotQuarantined, proto.SlotDisabled, proto.SlotDraining}

// maxOverviewPages bounds how many pages of nodes and slots the overview
// reads (1,000 each).
const maxOverviewPages = 20

func (u *UI) overview(q *req) error {
	d := overviewData{SlotStates: slotStates, Agents: map[string]string{}, NodesByMode: map[string]int{}}
	var regions proto.List[*proto.Region]
	if _, err := q.api.get("/v1/regions", url.Values{"limit": {"1000"}}, &regions); err != nil {
		return err
	}
	byName := map[string]*regionOverview{}
	for _, r := range regions.Items {
		ro := &regionOverview{Region: *r, Slots: map[proto.SlotStatus]int{}, NodesBy: map[proto.NodeState]int{}}
		byName[r.Name] = ro
		d.Regions = append(d.Regions, ro)
	}
	var av proto.List[*proto.Availability]
	if _, err := q.api.get("/v1/availability", nil, &av); err != nil {
		return err
	}
	for _, a := range av.Items {
		if ro := byName[a.Region]; ro != nil {
			ro.Avail = append(ro.Avail, a)
		}
	}
	nodeRegion := map[string]string{}
	after := ""
	for range maxOverviewPages {
		var nodes proto.List[*proto.Node]
		v := url.Values{"limit": {"1000"}}
		if after != "" {
			v.Set("after", after)
		}
		if _, err := q.api.get("/v1/nodes", v, &nodes); err != nil {
			return err
		}
		for _, n := range nodes.Items {
			nodeRegion[n.ID] = n.Region
			d.NodesByMode[string(n.ProfileIntent)]++
			if ro := byName[n.Region]; ro != nil {
				ro.Nodes++
				ro.NodesBy[n.State]++
			}
		}
		if after = nodes.Next; after == "" {
			break
		}
	}
	d.Truncated = after != ""
	after = ""
	for range maxOverviewPages {
		var slots proto.List[*proto.Slot]
		v := url.Values{"limit": {"1000"}}
		if after != "" {
			v.Set("after", after)
		}
		if _, err := q.api.get("/v1/slots", v, &slots); err != nil {
			return err
		}
		for _, s := range slots.Items {
			if ro := byName[nodeRegion[s.NodeID]]; ro != nil {
				ro.Slots[s.Status]++
				if s.PlacementBlocker() != "" {
					ro.Unhealthy++
				}
			}
		}
		if after = slots.Next; after == "" {
			break
		}
	}
	d.Truncated = d.Truncated || after != ""
	var peers proto.List[peerView]
	if _, err := q.api.get("/v1/operator/peers", nil, &peers); err == nil {
		d.Peers = peers.Items
	}
	if _, err := q.api.get("/v1/status", nil, &d.Status); err != nil {
		return err
	}
	if res, err := q.api.c.Do(q.api.ctx, http.MethodGet, "/v1/metrics", nil, nil, nil); err == nil {
		d.Agents = agentStates(res.Body)
	}
	return u.render(q, http.StatusOK, "overview", "Overview", "overview", d)
}

// agentStates reads gpuaas_agents{state="..."} from the metrics text.
func agentStates(b []byte) map[string]string {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, `gpuaas_agents{state="`)
		if !ok {
			continue
		}
		state, val, ok := strings.Cut(rest, `"} `)
		if ok {
			out[state] = val
		}
	}
	return out
}

// ---- nodes ----

type nodeRow struct {
	N        *proto.Node
	Drift    bool
	DriftWhy string
}

type nodesData struct {
	Rows               []nodeRow
	Next               string
	Region, State, Int string
	Search             string
}

func nodeDrift(n *proto.Node) (bool, string) {
	var why []string
	if n.LeaseDrift != nil {
		why = append(why, "host leases differ from the ledger's claims")
	}
	if n.Readiness != nil {
		for _, h := range n.Readiness.SlotHardware {
			if h.State != proto.HardwareOK {
				why = append(why, h.SlotID+" hardware "+h.Summary())
			}
		}
	}
	return len(why) > 0, strings.Join(why, "; ")
}

func (u *UI) nodes(q *req) error {
	search := strings.TrimSpace(q.r.URL.Query().Get("q"))
	if search != "" && proto.ValidateID("node", search) == nil {
		var nd proto.NodeDetail
		if _, err := q.api.get("/v1/nodes/"+esc(search), nil, &nd); err == nil {
			http.Redirect(q.w, q.r, Prefix+"nodes/"+esc(search), http.StatusSeeOther)
			return nil
		}
	}
	v := listQuery(q.r, "region", "pool", "state", "intent")
	var l proto.List[*proto.Node]
	if _, err := q.api.get("/v1/nodes", v, &l); err != nil {
		return err
	}
	d := nodesData{Next: nextURL(q.r, l.Next), Region: v.Get("region"), State: v.Get("state"), Int: v.Get("intent"), Search: search}
	for _, n := range l.Items {
		if search != "" && !strings.Contains(n.ID, search) && !strings.Contains(n.Hostname, search) {
			continue
		}
		drift, why := nodeDrift(n)
		d.Rows = append(d.Rows, nodeRow{N: n, Drift: drift, DriftWhy: why})
	}
	return u.render(q, http.StatusOK, "nodes", "Nodes", "nodes", d)
}

type slotPair struct {
	Index     int
	Candidate *proto.SlotCandidate
	Slot      *proto.Slot
	Drift     []proto.SlotDrift
	Differs   map[string]bool // field -> candidate and slot differ
	Drifted   bool            // topology drift, or the agent's scan found the hardware changed
	Approve   bool
}

type nodeData struct {
	D         proto.NodeDetail
	Breaker   breakerView
	GPUs      []gpuHealth
	Topo      *proto.CandidateTopology
	TopoErr   string
	Pairs     []slotPair
	Tasks     []*proto.Task
	DriftFlag bool
	DriftWhy  string
}

func (u *UI) node(q *req) error {
	id := q.r.PathValue("id")
	var d nodeData
	if _, err := q.api.get("/v1/nodes/"+esc(id), after(q.readIndex()), &d.D); err != nil {
		return err
	}
	var topo proto.CandidateTopology
	if _, err := q.api.get("/v1/nodes/"+esc(id)+"/topology", nil, &topo); err == nil {
		d.Topo = &topo
	} else if cli.IsProblem(err, proto.CodeNotFound) {
		d.TopoErr = errText(err)
	} else {
		return err
	}
	var sl proto.List[*proto.Slot]
	if _, err := q.api.get("/v1/slots", url.Values{"node": {id}, "limit": {"1000"}}, &sl); err != nil {
		return err
	}
	var ts proto.List[*proto.Task]
	if _, err := q.api.get("/v1/nodes/"+esc(id)+"/tasks", url.Values{"limit": {"50"}}, &ts); err == nil {
		d.Tasks = ts.Items
	}
	d.Breaker = breakerOf(&d.D.Node)
	if d.Topo != nil && d.Topo.Hardware != nil {
		slotOf := map[string]string{}
		for _, s := range sl.Items {
			slotOf[s.Capacity.GPUPCIAddress] = s.ID
		}
		for _, g := range d.Topo.Hardware.GPUs {
			d.GPUs = append(d.GPUs, gpuHealth{GPU: g, SlotID: slotOf[g.PCIAddress], Link: g.LinkDowngrade()})
		}
	}
	d.DriftFlag, d.DriftWhy = nodeDrift(&d.D.Node)
	if len(d.D.Drift) > 0 {
		d.DriftFlag = true
	}
	pairs := map[int]*slotPair{}
	get := func(i int) *slotPair {
		if p := pairs[i]; p != nil {
			return p
		}
		p := &slotPair{Index: i, Differs: map[string]bool{}}
		pairs[i] = p
		return p
	}
	for _, s := range sl.Items {
		get(s.Index).Slot = s
	}
	if d.Topo != nil {
		for i := range d.Topo.Candidates {
			c := &d.Topo.Candidates[i]
			get(c.Index).Candidate = c
		}
	}
	for _, p := range pairs {
		if p.Slot != nil {
			for _, dr := range d.D.Drift {
				if dr.SlotID == p.Slot.ID {
					p.Drift = append(p.Drift, dr)
				}
			}
		}
		if p.Slot != nil && p.Candidate != nil {
			a, b := p.Slot.Capacity, p.Candidate.Capacity
			p.Differs["gpu"] = a.GPUPCIAddress != b.GPUPCIAddress
			p.Differs["nvme"] = a.NVMe.Serial != b.NVMe.Serial || a.NVMe.SizeBytes != b.NVMe.SizeBytes
			p.Differs["vf"] = a.FabricVFPCIAddress != b.FabricVFPCIAddress
			p.Differs["mac"] = a.ManagementMAC != b.ManagementMAC
		}
		p.Drifted = len(p.Drift) > 0 || p.Slot != nil && p.Slot.HardwareBlocker() != ""
		for _, d := range p.Differs {
			p.Drifted = p.Drifted || d
		}
		p.Approve = p.Candidate != nil && (p.Slot == nil || p.Slot.Status == proto.SlotDisabled)
		d.Pairs = append(d.Pairs, *p)
	}
	slices.SortFunc(d.Pairs, func(a, b slotPair) int { return a.Index - b.Index })
	return u.render(q, http.StatusOK, "node", "Node "+id, "nodes", d)
}

func (u *UI) nodeApprove(q *req) error {
	id := q.r.PathValue("id")
	i, err := strconv.Atoi(q.r.PostForm.Get("index"))
	if err != nil || i < 0 {
		return badInput("candidate index %q is not a non-negative integer", q.r.PostForm.Get("index"))
	}
	var s proto.Slot
	idx, err := q.api.send(http.MethodPost, "/v1/nodes/"+esc(id)+"/slots", proto.SlotApproveBody{Index: i}, nil, &s)
	if err != nil {
		return err
	}
	return q.redirect(Prefix+"nodes/"+esc(id), idx, fmt.Sprintf("candidate %d approved as slot %s", i, s.ID))
}

// breakerView is a node's circuit breaker as the node and slot pages
// show it (proto/breaker.go).
type breakerView struct {
	State    string // open | probation | closed | "" (never tripped, no failures)
	Detail   string
	Failures []proto.BreakerFailure
	Trips    int
	ClosedBy string
}

func breakerOf(n *proto.Node) breakerView {
	b := n.Breaker
	if b == nil {
		return breakerView{}
	}
	v := breakerView{Failures: b.Failures, Trips: b.Trips, ClosedBy: b.ClosedBy}
	switch {
	case b.Open:
		v.State = "open"
		v.Detail = fmt.Sprintf("out of placement since %s until %s (or an admin's reset): %s",
			b.OpenedAt.UTC().Format(time.RFC3339), b.Until.UTC().Format(time.RFC3339), b.Reason)
	case b.Probation:
		v.State = "probation"
		v.Detail = "closed after its cool-down, on probation: one more failed allocation reopens it"
	case len(b.Failures) > 0 || b.Trips > 0:
		v.State = "closed"
		v.Detail = fmt.Sprintf("%d recent failed allocation(s); it opens at %d within %v", len(b.Failures), proto.BreakerThreshold, proto.BreakerWindow)
	}
	return v
}

// gpuHealth is one GPU of the node's latest hardware scan: its PCIe link
// and the faults hostops/gpuhealth found (Xids, fallen off the bus, ECC,
// row remap, NVLink, thermal).
type gpuHealth struct {
	GPU    proto.GPUInventory
	SlotID string
	Link   string // how the link runs below its maximum, "" when it does not
}

func (u *UI) nodeResetBreaker(q *req) error {
	id := q.r.PathValue("id")
	idx, err := q.api.send(http.MethodPost, "/v1/nodes/"+esc(id)+"/breaker/reset", nil, nil, nil)
	if err != nil {
		return err
	}
	back := q.r.PostForm.Get("back")
	if !strings.HasPrefix(back, Prefix) || strings.HasPrefix(back, "//") {
		back = Prefix + "nodes/" + esc(id)
	}
	return q.redirect(back, idx, "circuit breaker of "+id+" reset: the node takes placements again")
}

func (u *UI) nodeDrain(drain bool) handlerFunc {
	return func(q *req) error {
		id := q.r.PathValue("id")
		verb, msg := "drain", "draining: new placements go elsewhere"
		if !drain {
			verb, msg = "undrain", "undrained: the node takes placements again"
		}
		idx, err := q.api.send(http.MethodPost, "/v1/nodes/"+esc(id)+"/"+verb, nil, nil, nil)
		if err != nil {
			return err
		}
		return q.redirect(Prefix+"nodes/"+esc(id), idx, msg)
	}
}

// ---- slots ----

type slotsData struct {
	Items        []*proto.Slot
	Next         string
	Node, Status string
	States       []proto.SlotStatus
}

func (u *UI) slots(q *req) error {
	v := listQuery(q.r, "node", "status")
	for k, vs := range after(q.readIndex()) {
		v[k] = vs
	}
	var l proto.List[*proto.Slot]
	if _, err := q.api.get("/v1/slots", v, &l); err != nil {
		return err
	}
	return u.render(q, http.StatusOK, "slots", "Slots", "slots",
		slotsData{Items: l.Items, Next: nextURL(q.r, l.Next), Node: v.Get("node"), Status: v.Get("status"), States: slotStates})
}

func (u *UI) slot(q *req) error {
	id := q.r.PathValue("id")
	if idx := q.readIndex(); idx > 0 {
		var l proto.List[*proto.Slot]
		if _, err := q.api.get("/v1/slots", url.Values{"index": {strconv.FormatUint(idx-1, 10)}, "wait": {"5s"}, "limit": {"1"}}, &l); err != nil {
			return err
		}
	}
	d := slotData{S: &proto.Slot{}}
	if _, err := q.api.get("/v1/slots/"+esc(id), nil, d.S); err != nil {
		return err
	}
	var nd proto.NodeDetail
	if _, err := q.api.get("/v1/nodes/"+esc(d.S.NodeID), nil, &nd); err == nil {
		d.Breaker = breakerOf(&nd.Node)
		d.NodeState = nd.Node.State
	}
	var topo proto.CandidateTopology
	if _, err := q.api.get("/v1/nodes/"+esc(d.S.NodeID)+"/topology", nil, &topo); err == nil && topo.Hardware != nil {
		for _, g := range topo.Hardware.GPUs {
			if g.PCIAddress == d.S.Capacity.GPUPCIAddress {
				d.GPU = &gpuHealth{GPU: g, SlotID: d.S.ID, Link: g.LinkDowngrade()}
			}
		}
		d.ScannedAt = topo.DiscoveredAt
	}
	if q.Can("GET /v1/audit") {
		d.History, d.HistoryMore, d.HistoryErr = slotHistory(q, id)
	}
	return u.render(q, http.StatusOK, "slot", "Slot "+id, "slots", d)
}

// slotData is the slot page: the slot, its node's circuit breaker, its
// GPU's latest health scan, and its lifecycle trail from the audit log.
type slotData struct {
	S           *proto.Slot
	NodeState   proto.NodeState
	Breaker     breakerView
	GPU         *gpuHealth
	ScannedAt   time.Time
	History     []proto.AuditRecord // newest first
	HistoryMore bool                // older records were left out
	HistoryErr  string
}

// maxSlotHistory is how many of a slot's audit records its page shows
// (the newest); gpuaasctl slot history pages through all of them.
const maxSlotHistory = 100

// slotHistory reads the slot's lifecycle trail (GET /v1/audit?slot=: the
// requests that touched it, the allocations placed on it, its node's
// drain), as gpuaasctl slot history does, newest first.
func slotHistory(q *req, id string) ([]proto.AuditRecord, bool, string) {
	var all []proto.AuditRecord
	after := ""
	for range 20 {
		v := url.Values{"slot": {id}, "limit": {strconv.Itoa(proto.MaxPageLimit)}}
		if after != "" {
			v.Set("after", after)
		}
		var l proto.List[proto.AuditRecord]
		if _, err := q.api.get("/v1/audit", v, &l); err != nil {
			return nil, false, errText(err)
		}
		all = append(all, l.Items...)
		if after = l.Next; after == "" {
			break
		}
	}
	slices.Reverse(all)
	more := len(all) > maxSlotHistory
	if more {
		all = all[:maxSlotHistory]
	}
	return all, more, ""
}

func (u *UI) slotAction(q *req) error {
	id, action := q.r.PathValue("id"), q.r.PathValue("action")
	var body any
	switch action {
	case "disable":
		body = proto.SlotDisableBody{Reason: strings.TrimSpace(q.r.PostForm.Get("reason"))}
	case "repair", "cleanup":
	default:
		return &userError{status: http.StatusNotFound, msg: "no slot action " + action + "; use disable, repair or cleanup"}
	}
	var s proto.Slot
	idx, err := q.api.send(http.MethodPost, "/v1/slots/"+esc(id)+"/"+action, body, nil, &s)
	if err != nil {
		return err
	}
	back := q.r.PostForm.Get("back")
	if !strings.HasPrefix(back, Prefix) || strings.HasPrefix(back, "//") {
		back = Prefix + "slots/" + esc(id)
	}
	return q.redirect(back, idx, fmt.Sprintf("slot %s: %s requested (now %s)", id, action, s.Status))
}

// ---- images ----

type imagesData struct {
	Items []*proto.Image
	State string
}

func (u *UI) images(q *req) error {
	v := url.Values{}
	if s := q.r.URL.Query().Get("state"); s != "" {
		v.Set("state", s)
	}
	for k, vs := range after(q.readIndex()) {
		v[k] = vs
	}
	var l proto.List[*proto.Image]
	if _, err := q.api.get("/v1/images", v, &l); err != nil {
		return err
	}
	return u.render(q, http.StatusOK, "images", "Images", "images", imagesData{Items: l.Items, State: v.Get("state")})
}

func (u *UI) imageAction(q *req) error {
	name, version, action := q.r.PathValue("name"), q.r.PathValue("version"), q.r.PathValue("action")
	if action != "approve" && action != "revoke" {
		return &userError{status: http.StatusNotFound, msg: "no image action " + action + "; use approve or revoke"}
	}
	body := proto.ImageApproveBody{Note: strings.TrimSpace(q.r.PostForm.Get("note"))}
	idx, err := q.api.send(http.MethodPost, "/v1/images/"+esc(name)+"/"+esc(version)+"/"+action, body, nil, nil)
	if err != nil {
		return err
	}
	return q.redirect(Prefix+"images", idx, fmt.Sprintf("image %s:%s: %s recorded", name, version, action))
}

// peerView is one Raft server as GET /v1/operator/peers answers.
type peerView struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	HTTPAddr string `json:"http_addr,omitempty"`
	Voter    bool   `json:"voter"`
	Leader   bool   `json:"leader"`
}

// ---- MAAS workflows and usage ----

type workflowsData struct {
	Items       []*proto.MAASWorkflow
	Next        string
	Site, State string
}

func (u *UI) workflows(q *req) error {
	v := listQuery(q.r, "site", "state")
	var l proto.List[*proto.MAASWorkflow]
	if _, err := q.api.get("/v1/workflows", v, &l); err != nil {
		return err
	}
	return u.render(q, http.StatusOK, "workflows", "MAAS workflows", "workflows",
		workflowsData{Items: l.Items, Next: nextURL(q.r, l.Next), Site: v.Get("site"), State: v.Get("state")})
}

type usageData struct {
	Items []*proto.UsageRecord
	Next  string
}

func (u *UI) usage(q *req) error {
	v := listQuery(q.r, "allocation", "since")
	var l proto.List[*proto.UsageRecord]
	if _, err := q.api.get("/v1/usage", v, &l); err != nil {
		return err
	}
	return u.render(q, http.StatusOK, "usage", "Usage", "usage", usageData{Items: l.Items, Next: nextURL(q.r, l.Next)})
}
