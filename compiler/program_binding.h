// Binding a compiled program to a step's arguments: which of them changed since the last binding (checked before
// anything changes), repointing replaced grad buffers, and rebuilding the argument tables.
#pragma once

#include "compiler/layout_staging.h"
#include "compiler/program.h"

#include <cstdint>
#include <vector>

namespace optjit {

// What changed in a step's arguments since the program's binding.
struct ArgumentChanges {
  const char* rebind_reason = nullptr; // non-null: the argument tables must be rebuilt
  std::vector<int64_t> replaced_grads; // otherwise: params whose grad buffer alone was replaced
};

// Validates the grads that changed since the program's last binding (before anything is mutated) and says what the
// binding needs.
void check_arguments(const StepSource& source, const Program& program, const LayoutStaging& staging,
                     ArgumentChanges& changes);
// Points the binding at grad buffers that replaced the bound ones (same shape, dtype and device: checked).
void repoint_grads(StepSource& source, Program& program, const LayoutStaging& staging,
                   const std::vector<int64_t>& replaced, StepMetrics& metrics);
// Creates missing state, stages the params whose tensors share no dense layout (`staging`) and builds every bucket's
// argument tables from the source's tensors now (a staged param's copies in its place).
void bind(StepSource& source, Program& program, LayoutStaging& staging, const char* reason, StepMetrics& metrics);

} // namespace optjit
