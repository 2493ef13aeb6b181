// Package regions splits a queue's global rate between several regions, each its own Sluice
// deployment (its own Redis and JetStream), through leases kept on a coordinator: a JetStream
// key-value bucket on a NATS server every region can reach (Bucket), one key per global queue.
//
// Model. A region holds a lease: a share of the budget (deliveries per second) until an
// expiry. Any worker of the region renews it ahead of expiry (every renew period) by reading
// the queue's Record, applying the rule (Renew) and writing it back on the revision it read
// (compare-and-set); a lost race reads again. Shares follow demand (the region's backlog
// drained within one renew period) by max-min fair division with a minimum per region
// (Divide). A region that cannot renew uses its lease until it expires, then its safe share.
//
// Guarantees, with every writer following Renew and clocks within the Lingers slack:
//   - the sum of what the regions hold (unexpired shares, and a lowered share's former value
//     until the region's other workers have read the lower one) never exceeds the budget;
//   - a coordinator without state (a new or emptied bucket) hands out nothing for one lease
//     period, so leases of a state it lost have expired before it hands out again;
//   - a silent region's lease counts as held until it expires.
//
// A rule's limit is shared the same way (its record keyed "rule." and its name, its budget the
// limit per key, per second): the ingress keeps its region's leases of them in a Holder, which
// renews them with the decisions it counted (the larger of the last two renew periods' rates)
// and cuts each decision's limit to its region's part (Holder.Limit, Cut: rounded down, so the
// parts never sum above the limit; a part below one request refuses without the limiter). The
// ingress's HTTP path and its Envoy rate-limit service both decide through it.
//
// Placement. With regional NATS clusters joined by gateways (a supercluster), every region
// names its own server as the coordinator and the bucket lives in the home region's cluster
// (Coordinator.Home places it when a region makes it); a region's renewals then cross the
// gateway. A renewal short of its target because another region's budget frees up within the
// renew period is told when (Lease.Retry), so that its holder renews again then.
//
// Costs: one read and one compare-and-set write on the coordinator per worker (or ingress),
// global queue (or rule) and renew period (two round trips: the bucket found is kept), and one
// more renewal per shift of shares; none on the path of a job; a read lock and an
// atomic add per decision of a global rule. docs/design/regions.md derives the bound the
// upstream sees.
package regions
