// TEMPORARY (branch issue12p only; delete at merge): the backward's one-shot API is implemented in
// another branch. This stub lets the Python extension link and its backward tests skip until then.
#include "sparsek/attention.hpp"

namespace sparsek {

void attention_backward(const AttentionBackwardArgs&, const Options&) {
  throw Error(Status::unsupported, "attention backward: not built in this branch");
}

std::vector<std::string> unsupported_reasons(const AttentionBackwardArgs&) {
  return {"attention backward: not built in this branch"};
}

}  // namespace sparsek
