/*
 * select_mask.h — a running policy's selection as the engine and the public
 * selection API (select_api.c) consume it: the budget's arithmetic and the
 * entry mask.  Above the policies and their registry (it asks a running
 * policy, policies/registry.h), below the context (infer/segments.c).
 */
#ifndef KS_SELECT_MASK_H
#define KS_SELECT_MASK_H

#include "policies/registry.h"

/* Budget arithmetic and entry mask (select_mask.c), shared by the engine and
 * the public selection API.  budget_binds: the budget leaves something to
 * choose among n entries (otherwise everything is attended, which is also
 * what makes a full budget bit-identical to dense).  select_mask: fill req's
 * sink, window and n_select from the policy's budget, ask the policy (sel's
 * buffers and cap set by the caller), and unless sel->all set in mask
 * ([n_entries / 64 + 1] words) the entries to attend: sinks, window and the
 * selection, pages expanded to their entries (page = P). */
bool ks_policy_budget_binds(const ks_policy *pol, int32_t n);
ks_status ks_policy_select_mask(ks_policy *pol, ks_select_req *req, ks_selection *sel, int32_t page, uint64_t *mask);

#endif
