package admin

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/queue"
)

// tenantSettingsView is the answer of PATCH /v1/queues/{queue}/tenants/{tenant}: the tenant's
// id and the settings an operator set for it, which replace the config file's for it alone.
type tenantSettingsView struct {
	Queue    string              `json:"queue"`
	Tenant   string              `json:"tenant"`
	Override queue.TenantControl `json:"override"`
}

// maxTenantOverrides bounds the tenants of one queue with settings of their own: each is one
// key of the meta bucket, which every worker watches.
const maxTenantOverrides = 10_000

// tenantSettings serves PATCH /v1/queues/{queue}/tenants/{tenant} on a fair queue: a JSON
// object with any of weight (a number > 0 and <= 1000), rate (a rate such as "5/s") and
// in_flight (an integer >= 1), each null to go back to the config file's. {tenant} is a tenant
// id or a tenant's value, as for GET. The settings are kept in one key of their own
// (queue.Operator.SetTenantControl: a PATCH writes one small entry, and up to
// maxTenantOverrides tenants per queue), so every worker applies them within a second and they
// survive restarts.
func (o *Ops) tenantSettings(w http.ResponseWriter, r *http.Request) error {
	cq, err := o.queueOf(r)
	if err != nil {
		return fail(w, err)
	}
	if !cq.Fair {
		return fail(w, errors.Join(queue.ErrUnknownQueue, errors.New("no fair queue named "+strconv.Quote(cq.Name))))
	}
	id := r.PathValue("tenant")
	if !isTenantID(id) {
		if o.Queues.TenantID == nil {
			return fail(w, badRequest("tenants are named by id (32 hex digits) here"))
		}
		if id, err = o.Queues.TenantID([]byte(id)); err != nil {
			return fail(w, err)
		}
	}
	change, err := parseTenantPatch(r.Body)
	if err != nil {
		return fail(w, err)
	}
	tc, err := o.Q.SetTenantControl(r.Context(), cq.Name, id, maxTenantOverrides, change)
	switch {
	case errors.Is(err, queue.ErrTooManyTenants):
		return fail(w, badRequest("queue %q has settings for %d tenants already, the most it keeps", cq.Name, maxTenantOverrides))
	case err != nil:
		return fail(w, err)
	}
	writeJSON(w, http.StatusOK, tenantSettingsView{Queue: cq.Name, Tenant: id, Override: tc})
	return nil
}

// parseTenantPatch reads a tenant's settings patch and returns the change it makes.
func parseTenantPatch(body io.Reader) (func(*queue.TenantControl), error) {
	const want = `want a JSON object with any of weight (a number > 0 and <= 1000), rate (such as "5/s") and in_flight (an integer >= 1), each null for the config file's`
	data, _ := io.ReadAll(io.LimitReader(body, 1<<16))
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil || len(raw) == 0 {
		return nil, badRequest(want)
	}
	var changes []func(*queue.TenantControl)
	for k, v := range raw {
		null := string(v) == "null"
		switch k {
		case "weight":
			var f float64
			if !null && (json.Unmarshal(v, &f) != nil || !(f > 0 && f <= 1000)) {
				return nil, badRequest("weight: want a number > 0 and <= 1000, or null")
			}
			changes = append(changes, func(c *queue.TenantControl) { c.Weight = f })
		case "rate":
			var s string
			rate := ""
			if !null {
				if json.Unmarshal(v, &s) != nil {
					return nil, badRequest(`rate: want a rate such as "5/s", or null`)
				}
				rt, err := config.ParseRate(s)
				if err != nil {
					return nil, badRequest("rate: %v", err)
				}
				rate = rt.String()
			}
			changes = append(changes, func(c *queue.TenantControl) { c.Rate = rate })
		case "in_flight":
			var n int64
			if !null && (json.Unmarshal(v, &n) != nil || n < 1 || n > 1_000_000) {
				return nil, badRequest("in_flight: want an integer >= 1 and <= 1000000, or null")
			}
			changes = append(changes, func(c *queue.TenantControl) { c.InFlight = n })
		default:
			return nil, badRequest("unknown field %q: %s", k, want)
		}
	}
	return func(c *queue.TenantControl) {
		for _, f := range changes {
			f(c)
		}
	}, nil
}
