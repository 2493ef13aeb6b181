// Package regions splits a queue's global rate between several regions, each its own Sluice
// deployment (its own Redis and JetStream), through leases kept on a coordinator: a JetStream
// key-value bucket on a NATS server every region can reach (Bucket), one key per global queue.
//
// Model. A region holds a lease: a share of the budget (deliveries per second) until an
// expiry. Each holder of the region (a worker process, an ingress: a Coordinator, with a random
// id) renews it ahead of expiry, every renew period, by reading the queue's Record, applying the
// rule (Renew) and writing it back on the revision it read (compare-and-set); a lost race tries
// again. The record keeps, per region, the share each holder last acknowledged (Lease.Holders)
// and counts for the region the largest, since its holders share one leak schedule. Shares
// follow demand (the region's backlog drained within one renew period) by max-min fair division
// with a minimum per region (Divide). A holder that cannot renew uses its lease until it
// expires, then its safe share.
//
// Between periods a holder watches its records (Coordinator.Watch) and renews at once when a
// change makes its renewal matter (Wants): another holder of its region lowered the region's
// share, which it acknowledges; another region wants budget it holds; budget it is short of is
// free, or will be at Lease.Retry. A Pacer spaces those renewals and the periodic ones.
//
// Guarantees, with every writer following Renew and clocks within the Lingers slack:
//   - the sum over the regions of the largest share any holder may apply (its acknowledged
//     share until its entry expires, and a lowered one's former share for Lingers, which
//     covers what it reserved ahead: a holder applies a lower share before the write that
//     lowers it) never exceeds the budget, whatever the watches and the links' latency do;
//   - a coordinator without state (a new or emptied bucket) hands out nothing for one lease
//     period, so leases of a state it lost have expired before it hands out again;
//   - a silent holder's entry, and so a silent region's lease, counts as held until it
//     expires (one lease: the cost of a holder that dies without Release).
//
// A rule's limit is shared the same way (its record keyed "rule." and its name, its budget the
// limit per key, per second): the ingress keeps its region's leases of them in a Holder, which
// renews them with the decisions' rate over the last renew period (checked every quarter period,
// a renewal at once when it halves or doubles) and cuts each decision's limit to its region's
// part (Holder.Limit, Cut: rounded down, so the parts never sum above the limit; a part below
// one request refuses without the limiter). The ingress's HTTP path and its Envoy rate-limit
// service both decide through it.
//
// Placement. With regional NATS clusters joined by gateways (a supercluster), every region
// names its own server as the coordinator and the bucket lives in the home region's cluster
// (Coordinator.Home places it when a region makes it); a region's renewals then cross the
// gateway: one round trip (the write) when its watch has the record, two otherwise.
//
// Costs: one compare-and-set write (and a read, without a fresh watched record) on the
// coordinator per holder, global queue (or rule) and renew period; a watch (one ordered
// consumer) per holder and global budget; renewals on change, at most one per 100 ms per
// holder and budget, none while the shares are steady; none on the path of a job; a read lock
// and a mutex per decision of a global rule. docs/design/regions.md derives the bound the
// upstream sees.
package regions
