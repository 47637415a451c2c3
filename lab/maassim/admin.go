package maassim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// The admin endpoint (AdminPrefix, outside /MAAS, no OAuth) lets the lab
// drive the simulator from outside the process:
//
//	GET    /_sim/requests                     request log (JSON)
//	GET    /_sim/machines                     machine snapshots (JSON)
//	GET    /_sim/events?system_id=ID          events (JSON)
//	POST   /_sim/machines/{id}/faults         arm a fault: {"kind":"deploy_stuck","op":"","times":1,"delay":"50ms"}
//	DELETE /_sim/machines/{id}/faults         disarm all faults
//	POST   /_sim/hardware                     {"mac":"..","hardware":{...Hardware...}}
//	POST   /_sim/clock/advance?d=10m          advance a ManualClock
//	POST   /_sim/enlist                       {"Hostname":..,"MACs":[..],"PowerType":..,"PowerParams":{..}}
//	POST   /_sim/subnets                      {"ID":..,"Name":..,"CIDR":..,"VID":..,"GatewayIP":..}

// FaultRequest is the admin endpoint's fault body.
type FaultRequest struct {
	Kind  FaultKind `json:"kind"`
	Op    string    `json:"op,omitempty"`
	Times int       `json:"times,omitempty"`
	Delay string    `json:"delay,omitempty"` // Go duration, e.g. "50ms"
}

func adminJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func adminErr(w http.ResponseWriter, status int, err error) {
	adminJSON(w, status, map[string]string{"error": err.Error()})
}

func (s *Server) serveAdmin(w http.ResponseWriter, r *http.Request) {
	segs := strings.Split(strings.Trim(strings.TrimPrefix(r.URL.Path, AdminPrefix), "/"), "/")
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		adminErr(w, http.StatusBadRequest, fmt.Errorf("read admin body: %w", err))
		return
	}
	switch {
	case r.Method == http.MethodGet && len(segs) == 1 && segs[0] == "requests":
		adminJSON(w, http.StatusOK, s.Requests(nil))
	case r.Method == http.MethodGet && len(segs) == 1 && segs[0] == "machines":
		adminJSON(w, http.StatusOK, s.Machines())
	case r.Method == http.MethodGet && len(segs) == 1 && segs[0] == "events":
		adminJSON(w, http.StatusOK, s.Events(r.URL.Query().Get("system_id")))
	case len(segs) == 3 && segs[0] == "machines" && segs[2] == "faults":
		switch r.Method {
		case http.MethodPost:
			var fr FaultRequest
			if err := json.Unmarshal(body, &fr); err != nil {
				adminErr(w, http.StatusBadRequest, fmt.Errorf("decode fault: %w", err))
				return
			}
			f := Fault{Kind: fr.Kind, Op: fr.Op, Times: fr.Times}
			if fr.Delay != "" {
				d, err := time.ParseDuration(fr.Delay)
				if err != nil {
					adminErr(w, http.StatusBadRequest, fmt.Errorf("decode fault delay: %w", err))
					return
				}
				f.Delay = d
			}
			if err := s.InjectFault(segs[1], f); err != nil {
				adminErr(w, http.StatusBadRequest, err)
				return
			}
			adminJSON(w, http.StatusOK, fr)
		case http.MethodDelete:
			s.ClearFaults(segs[1])
			w.WriteHeader(http.StatusNoContent)
		default:
			adminErr(w, http.StatusMethodNotAllowed, fmt.Errorf("method %s", r.Method))
		}
	case r.Method == http.MethodPost && len(segs) == 1 && segs[0] == "hardware":
		var req struct {
			MAC      string   `json:"mac"`
			Hardware Hardware `json:"hardware"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			adminErr(w, http.StatusBadRequest, fmt.Errorf("decode hardware: %w", err))
			return
		}
		if err := s.SetHardware(req.MAC, req.Hardware); err != nil {
			adminErr(w, http.StatusBadRequest, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPost && len(segs) == 1 && segs[0] == "enlist":
		var e Enlistment
		if err := json.Unmarshal(body, &e); err != nil {
			adminErr(w, http.StatusBadRequest, fmt.Errorf("decode enlistment: %w", err))
			return
		}
		id, err := s.Enlist(e)
		if err != nil {
			adminErr(w, http.StatusBadRequest, err)
			return
		}
		adminJSON(w, http.StatusOK, map[string]string{"system_id": id})
	case r.Method == http.MethodPost && len(segs) == 1 && segs[0] == "subnets":
		var sn Subnet
		if err := json.Unmarshal(body, &sn); err != nil || sn.CIDR == "" {
			adminErr(w, http.StatusBadRequest, fmt.Errorf("decode subnet (CIDR required): %v", err))
			return
		}
		adminJSON(w, http.StatusOK, s.AddSubnet(sn))
	case r.Method == http.MethodPost && len(segs) == 2 && segs[0] == "clock" && segs[1] == "advance":
		mc, ok := s.clock.(*ManualClock)
		if !ok {
			adminErr(w, http.StatusConflict, fmt.Errorf("advance clock: the simulator clock is not manual"))
			return
		}
		d, err := time.ParseDuration(r.URL.Query().Get("d"))
		if err != nil || d < 0 {
			adminErr(w, http.StatusBadRequest, fmt.Errorf("advance clock: bad duration %q", r.URL.Query().Get("d")))
			return
		}
		mc.Advance(d)
		adminJSON(w, http.StatusOK, map[string]string{"now": mc.Now().UTC().Format(time.RFC3339Nano)})
	default:
		adminErr(w, http.StatusNotFound, fmt.Errorf("no admin route %s %s", r.Method, r.URL.Path))
	}
}
