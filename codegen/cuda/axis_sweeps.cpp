// The GPU kernel of a plan that reads or writes rows and columns (Adafactor's factored moments): a block per item of
// whole rows, a column sweep and a row sweep over them (emit_gpu_axis_kernel below says how), so that every sum has an
// order fixed by the tensor's shape and the block's size.
#include "codegen/cuda/gpu_kernel_emitter.h"

namespace optjit::emission {
namespace {

// Row sums of one GPU axis kernel (emit_gpu_row_sweep): 8 KB of shared memory each.
constexpr std::size_t kGpuMaxRowSums = 4;

class GpuAxisKernelEmitter : public GpuKernelEmitter {
public:
  using GpuKernelEmitter::GpuKernelEmitter;

  // The GPU kernel of a plan that reads or writes rows and columns: a block per item of whole rows
  // (runtime/work_items.h's make_axis_work_items), in two sweeps over the item's rows, so that every sum has an order
  // fixed by the tensor's shape and the block's size, and a row or column is written only after every element has
  // read its old value.
  //   Column sweep (kernels with column sums): a thread per column of the item, its rows in order. It evaluates each
  //   element for the sums and stores nothing. A barrier follows. An item of whole matrices writes its column sums;
  //   a piece of a matrix writes them as partials to the column scratch.
  //   Row sweep (kernels with row sums, per-tensor reductions or stores): a group of min(n, 32) lanes per row (a
  //   warp, or a part of one for rows shorter than 32), in rounds of one row per group; the lanes take every
  //   width-th column. A round runs its rows in two stages, each ended by a barrier: first the rows that are not
  //   the last of their matrix, then those that are. Elements store their tensor slots as they go, and a matrix's
  //   last row its columns slots (each column's other rows were read in earlier stages; a piece of a matrix keeps
  //   them in the column scratch instead, as other pieces may not have read them yet). After a stage's barrier,
  //   the group's lane 0 adds its lanes' sums in lane order (through shared memory, double buffered by stage), and
  //   the lane that had the row's last column writes its rows slots.
  //   Last item of a cut tensor (the whole block): each column's partials added in piece order, and the pending
  //   columns stores written.
  void emit_gpu_axis_kernel(const std::string& symbol) {
    IRBuilder<> b(ctx_);
    GpuEntry e = begin_gpu_kernel(b, symbol);
    Value* t = e.item.tensor;
    Value* matrix = e.param(GpuParam::matrix);
    const auto extent_of = [&](int64_t k) {
      return b.CreateLoad(i64_, b.CreateGEP(i64_, matrix, b.CreateAdd(b.CreateMul(t, b.getInt64(3)), b.getInt64(k))));
    };
    const auto load_at = [&](GpuParam p, Value* index) {
      return b.CreateLoad(i64_, b.CreateGEP(i64_, e.param(p), index));
    };
    Value* col_base = load_at(GpuParam::col_base, t);
    axis_ = AxisIndex{extent_of(0), extent_of(1), load_at(GpuParam::row_base, t), col_base, e.param(GpuParam::axis)};
    AxisItem item;
    Value* n = b.CreateSelect(b.CreateICmpSGT(axis_->n, b.getInt64(0)), axis_->n, b.getInt64(1)); // no rows: any n
    item.first_row = b.CreateSDiv(e.item.begin, n);
    item.end_row = b.CreateSDiv(e.item.end, n);
    item.columns = b.CreateSub(load_at(GpuParam::col_base, b.CreateAdd(t, b.getInt64(1))), col_base);
    item.pieces = load_at(GpuParam::col_split, b.CreateMul(t, b.getInt64(2)));
    item.split = b.CreateICmpSGT(item.pieces, b.getInt64(1));
    Value* m = b.CreateSelect(b.CreateICmpSGT(axis_->m, b.getInt64(0)), axis_->m, b.getInt64(1));
    Value* item_in_tensor = b.CreateSub(e.block, load_at(GpuParam::first_item, t));
    item.piece = b.CreateSub(item_in_tensor, b.CreateMul(b.CreateSDiv(item.first_row, m), item.pieces));
    item.scratch = b.CreateGEP(b.getDoubleTy(), b.CreateAddrSpaceCast(e.param(GpuParam::col_scratch), e.global),
                               load_at(GpuParam::col_split, b.CreateAdd(b.CreateMul(t, b.getInt64(2)), b.getInt64(1))));
    item.lanes = item.vector = b.getInt1(false);
    if (lanes_ > 1) { // n a multiple of lanes_, and for vector accesses each tensor-shaped slot's data aligned too
      item.lanes = b.CreateICmpEQ(b.CreateSRem(axis_->n, b.getInt64(lanes_)), b.getInt64(0));
      item.vector = b.CreateAnd(item.lanes, lanes_aligned(b, e.bases, b.getInt64(0))); // rows start at multiples
    }
    const ColumnSplit split = column_split(plan_);
    bool row_sums = false;
    for (ValueId id : axis_reductions_)
      row_sums |= graph_.node(id).op == Op::row_sum;
    bool stores = false;
    for (const Store& s : graph_.stores)
      stores |= s.kind == StoreKind::Tensor;
    if (split.sums > 0) {
      emit_gpu_column_sweep(b, e, item);
      gpu_barrier(b);
    }
    if (row_sums || stores || reduction_count() > 0)
      emit_gpu_row_sweep(b, e, item);
    if (split.sums + split.stores == 0) {
      axis_.reset();
      end_gpu_kernel(b, e);
      return;
    }
    end_gpu_kernel(b, e, [&] {
      emit_if(b, item.split, "columns", [&] {
        emit_loop(b, e.thread, item.columns, e.threads, "columns.combine",
                  [&](Value* column) { emit_column_finish(b, e, item, column); });
      });
    });
    axis_.reset();
  }
  // The rows a GPU axis kernel's block walks (its item) and how its tensor is cut (emit_gpu_axis_kernel).
  struct AxisItem {
    Value* first_row; // the item's rows in the tensor: [first_row, end_row)
    Value* end_row;
    Value* columns; // the tensor's columns, over its matrices
    Value* pieces;  // the items each matrix is cut into
    Value* split;   // pieces > 1: the item is a piece of one matrix
    Value* piece;   // which piece (when split)
    Value* scratch; // the tensor's region of the column scratch (f64)
    // n is a multiple of lanes_: the row sweep's lanes take lanes_ columns at a time, whatever the alignment, so
    // that its sums' order depends on the shape alone.
    Value* lanes;
    Value* vector; // and every row of every tensor-shaped slot is aligned to them: 128-bit accesses
  };
  // Column sum number `k` (of the kernel's col_sum nodes): piece `piece`'s partial at tensor column `column`.
  Value* column_partial(IRBuilder<>& b, const AxisItem& item, int64_t k, Value* piece, Value* column) {
    Value* row = b.CreateAdd(b.CreateMul(b.getInt64(k), item.pieces), piece);
    return b.CreateGEP(b.getDoubleTy(), item.scratch, b.CreateAdd(b.CreateMul(row, item.columns), column));
  }
  // Columns store number `k` (of the kernel's tensor stores to columns slots): its pending value at `column`.
  Value* column_pending(IRBuilder<>& b, const AxisItem& item, int64_t k, Value* column) {
    Value* row = b.CreateAdd(b.CreateMul(b.getInt64(column_split(plan_).sums), item.pieces), b.getInt64(k));
    return b.CreateGEP(b.getDoubleTy(), item.scratch, b.CreateAdd(b.CreateMul(row, item.columns), column));
  }
  // The last item of a cut tensor, at tensor column `column`: each column sum over the pieces in piece order, and
  // each pending columns store written to its slot.
  void emit_column_finish(IRBuilder<>& b, const GpuEntry& e, const AxisItem& item, Value* column) {
    axis_->col = column;
    IRBuilder<> entry(&e.fn->getEntryBlock(), e.fn->getEntryBlock().begin());
    int64_t k = 0;
    for (ValueId id : axis_reductions_) {
      if (graph_.node(id).op != Op::col_sum)
        continue;
      llvm::AllocaInst* sum = entry.CreateAlloca(b.getDoubleTy());
      b.CreateStore(llvm::ConstantFP::get(b.getDoubleTy(), 0.0), sum);
      emit_loop(b, b.getInt64(0), item.pieces, b.getInt64(1), "columns.piece", [&](Value* piece) {
        Value* partial = b.CreateLoad(b.getDoubleTy(), column_partial(b, item, k, piece, column));
        b.CreateStore(b.CreateFAdd(b.CreateLoad(b.getDoubleTy(), sum), partial), sum);
      });
      b.CreateStore(b.CreateLoad(b.getDoubleTy(), sum), axis_array_address(b, carry_of_reduction(id), SlotKind::Cols));
      ++k;
    }
    k = 0;
    for (const Store& s : graph_.stores) {
      if (s.kind != StoreKind::Tensor || graph_.slot(s.name)->kind != SlotKind::Cols)
        continue;
      const int slot = index_in(plan_.abi.tensor_slots, s.name);
      const Dtype storage = tensor_slot_dtype(slot);
      Value* value = b.CreateFPCast(b.CreateLoad(b.getDoubleTy(), column_pending(b, item, k, column)), element_type());
      b.CreateAlignedStore(to_storage(b, value, storage), slot_address(b, e.bases, slot, nullptr),
                           llvm::Align(dtype_size(storage)));
      ++k;
    }
    axis_->col = nullptr;
  }
  // A thread per column of the item's matrices (counted over the tensor's matrices, as col_base counts them), or per
  // lanes_ adjacent columns where item.vector allows, the item's rows of it in order: each column sum in element
  // order (the same order either way), stored once (a partial, when the item is a piece).
  void emit_gpu_column_sweep(IRBuilder<>& b, const GpuEntry& e, const AxisItem& item) {
    Value* m = axis_->m;
    Value* n = axis_->n;
    // The item's matrices: [first_row / m, ceil(end_row / m)), none for an empty item (m, n > 0 otherwise).
    Value* empty = b.CreateICmpEQ(item.first_row, item.end_row);
    Value* safe_m = b.CreateSelect(empty, b.getInt64(1), m);
    Value* first = b.CreateMul(b.CreateSDiv(item.first_row, safe_m), n);
    Value* last = b.CreateMul(b.CreateSDiv(b.CreateAdd(item.end_row, b.CreateSub(safe_m, b.getInt64(1))), safe_m), n);
    last = b.CreateSelect(empty, first, last);
    // A thread takes `lanes` adjacent columns at a time (one vector access per row), each summed on its own.
    const auto sweep = [&](int lanes) {
      IRBuilder<> entry(&e.fn->getEntryBlock(), e.fn->getEntryBlock().begin());
      std::vector<std::vector<llvm::AllocaInst*>> sums(static_cast<std::size_t>(lanes));
      for (auto& lane_sums : sums)
        for (ValueId id : axis_reductions_)
          lane_sums.push_back(graph_.node(id).op == Op::col_sum ? entry.CreateAlloca(b.getDoubleTy()) : nullptr);
      Value* step = b.CreateMul(e.threads, b.getInt64(lanes));
      emit_loop(
          b, b.CreateAdd(first, b.CreateMul(e.thread, b.getInt64(lanes))), last, step, "column", [&](Value* column) {
            Value* in_matrix = b.CreateSDiv(column, n); // lanes divides n: the lanes share the matrix
            Value* c = b.CreateSub(column, b.CreateMul(in_matrix, n));
            Value* matrix_row = b.CreateMul(in_matrix, m);
            Value* rows_begin = b.CreateSelect(b.CreateICmpSGT(item.first_row, matrix_row), item.first_row, matrix_row);
            Value* matrix_end = b.CreateAdd(matrix_row, m);
            Value* rows_end = b.CreateSelect(b.CreateICmpSLT(item.end_row, matrix_end), item.end_row, matrix_end);
            for (const auto& lane_sums : sums)
              for (llvm::AllocaInst* sum : lane_sums)
                if (sum)
                  b.CreateStore(llvm::ConstantFP::get(b.getDoubleTy(), 0.0), sum);
            emit_loop(b, rows_begin, rows_end, b.getInt64(1), "column.row", [&](Value* row) {
              Value* first_j = b.CreateAdd(b.CreateMul(row, n), c);
              std::vector<Value*> loaded(e.bases.size(), nullptr);
              for (int lane = 0; lane < lanes; ++lane) {
                Value* j = lane == 0 ? first_j : b.CreateAdd(first_j, b.getInt64(lane));
                set_axis_position(b, row, in_matrix, b.CreateSub(row, matrix_row),
                                  lane == 0 ? c : b.CreateAdd(c, b.getInt64(lane)));
                const std::vector<Value*> values = evaluate_elements(
                    b, e.values, [&](int slot) { return load_lane(b, e.bases, loaded, first_j, lanes, lane, slot, j); },
                    element_type(), j);
                add_axis_sums(b, values, sums[static_cast<std::size_t>(lane)]);
              }
            });
            for (int lane = 0; lane < lanes; ++lane) {
              Value* lane_column = lane == 0 ? column : b.CreateAdd(column, b.getInt64(lane));
              set_axis_position(b, nullptr, in_matrix, nullptr, lane == 0 ? c : b.CreateAdd(c, b.getInt64(lane)));
              int64_t k = 0;
              for (std::size_t r = 0; r < axis_reductions_.size(); ++r) {
                llvm::AllocaInst* sum = sums[static_cast<std::size_t>(lane)][r];
                if (!sum)
                  continue;
                Value* whole = axis_array_address(b, carry_of_reduction(axis_reductions_[r]), SlotKind::Cols);
                Value* partial = column_partial(b, item, k++, item.piece, lane_column);
                b.CreateStore(b.CreateLoad(b.getDoubleTy(), sum), b.CreateSelect(item.split, partial, whole));
              }
            }
          });
    };
    if (lanes_ > 1)
      emit_if(b, item.vector, "columns.vector", [&] { sweep(lanes_); });
    emit_if(b, b.CreateNot(item.vector), "columns.scalar", [&] { sweep(1); });
    clear_axis_position();
  }
  // The item's rows in rounds of one row per lane group, each round in two stages (emit_gpu_axis_kernel).
  void emit_gpu_row_sweep(IRBuilder<>& b, const GpuEntry& e, const AxisItem& item) {
    IRBuilder<> entry(&e.fn->getEntryBlock(), e.fn->getEntryBlock().begin());
    RowSweep sweep;
    for (std::size_t k = 0; k < axis_reductions_.size(); ++k)
      if (graph_.node(axis_reductions_[k]).op == Op::row_sum) {
        sweep.lane_sums.push_back(entry.CreateAlloca(b.getDoubleTy()));
        sweep.row_sums.push_back(k);
      } else {
        sweep.lane_sums.push_back(nullptr);
      }
    for (const Store& s : graph_.stores) // a rows slot's value at the lane's last column
      sweep.pending.push_back(s.kind == StoreKind::Tensor && graph_.slot(s.name)->kind == SlotKind::Rows
                                  ? entry.CreateAlloca(scalar_type(slot_dtype(s.name)))
                                  : nullptr);
    // Two buffers of a double per thread and row sum, beside the block reduction's (at most 16 KB): a GPU block has
    // 48 KB of static shared memory.
    if (sweep.row_sums.size() > kGpuMaxRowSums)
      throw Error("kernel " + plan_.name + " sums " + std::to_string(sweep.row_sums.size()) +
                  " values along rows in one pass: its GPU kernel holds at most " + std::to_string(kGpuMaxRowSums) +
                  " (shared memory); run these params on the CPU, or split the row sums across passes");
    llvm::GlobalVariable* shared = nullptr;
    if (!sweep.row_sums.empty())
      shared = shared_doubles(2 * kGpuMaxBlockThreads * sweep.row_sums.size(), plan_.name + "_row_sums");
    // Lane `lane`'s sum of row sum number `r` (of sweep.row_sums) in stage `stage`'s buffer.
    sweep.cell = [&](int stage, std::size_t r, Value* thread) {
      const int64_t buffer =
          (static_cast<int64_t>(stage) * static_cast<int64_t>(sweep.row_sums.size()) + static_cast<int64_t>(r)) *
          kGpuMaxBlockThreads;
      return b.CreateGEP(b.getDoubleTy(), shared, b.CreateAdd(b.getInt64(buffer), thread));
    };
    // Rows shorter than a warp share it: a group of `width` = min(n, 32) lanes per row, 32 / width rows per warp (the
    // lanes past the last whole group idle), so that a [196608, 3] tensor takes 16 rounds of 160 rows, not of 16.
    Value* m = axis_->m;
    Value* n = axis_->n;
    Value* width = b.CreateSelect(b.CreateICmpSLT(n, b.getInt64(32)), n, b.getInt64(32));
    width = b.CreateSelect(b.CreateICmpSGT(width, b.getInt64(0)), width, b.getInt64(1)); // no rows: any width
    Value* rows_per_warp = b.CreateSDiv(b.getInt64(32), width);
    Value* lane_in_warp = b.CreateAnd(e.thread, b.getInt64(31));
    Value* group = b.CreateSDiv(lane_in_warp, width);
    Value* lane = b.CreateSub(lane_in_warp, b.CreateMul(group, width)); // in the row's group
    Value* rows_per_round = b.CreateMul(b.CreateLShr(e.threads, 5), rows_per_warp);
    Value* first_row = b.CreateAdd(b.CreateMul(b.CreateLShr(e.thread, 5), rows_per_warp), group);
    Value* grouped = b.CreateICmpSLT(group, rows_per_warp);
    Value* rows = b.CreateSub(item.end_row, item.first_row);
    Value* rounds = b.CreateSDiv(b.CreateAdd(rows, b.CreateSub(rows_per_round, b.getInt64(1))), rows_per_round);
    // The lane of a row's last column (of its last lanes_ columns when the lanes take them together).
    Value* last_lane =
        b.CreateSelect(item.lanes, b.CreateSRem(b.CreateSub(b.CreateSDiv(n, b.getInt64(lanes_)), b.getInt64(1)), width),
                       b.CreateSRem(b.CreateSub(n, b.getInt64(1)), width));
    emit_loop(b, b.getInt64(0), rounds, b.getInt64(1), "round", [&](Value* round) {
      Value* row = b.CreateAdd(item.first_row, b.CreateAdd(b.CreateMul(round, rows_per_round), first_row));
      Value* valid = b.CreateAnd(grouped, b.CreateICmpSLT(row, item.end_row));
      Value* in_matrix = b.CreateSDiv(row, m); // m > 0: the tensor has rows
      Value* row_in_matrix = b.CreateSub(row, b.CreateMul(in_matrix, m));
      Value* last_row = b.CreateICmpEQ(row_in_matrix, b.CreateSub(m, b.getInt64(1)));
      for (int stage = 0; stage < 2; ++stage) {
        Value* active = b.CreateAnd(valid, stage == 0 ? b.CreateNot(last_row) : last_row);
        emit_if(b, active, "row", [&] {
          for (llvm::AllocaInst* sum : sweep.lane_sums)
            if (sum)
              b.CreateStore(llvm::ConstantFP::get(b.getDoubleTy(), 0.0), sum);
          const RowPosition at{row, in_matrix, row_in_matrix, stage == 1 ? &item : nullptr};
          // The same columns per lane and order with and without vector accesses: only the loads and stores differ.
          const auto lanes_loop = [&](bool vector_access) {
            emit_loop(b, b.CreateMul(lane, b.getInt64(lanes_)), n, b.CreateMul(width, b.getInt64(lanes_)), "row.vec",
                      [&](Value* c) { emit_row_elements(b, e, sweep, at, c, lanes_, vector_access); });
          };
          if (lanes_ > 1) {
            emit_if(b, item.vector, "row.vector", [&] { lanes_loop(true); });
            emit_if(b, b.CreateAnd(item.lanes, b.CreateNot(item.vector)), "row.lanes", [&] { lanes_loop(false); });
          }
          emit_if(b, b.CreateNot(item.lanes), "row.scalar", [&] {
            emit_loop(b, lane, n, width, "row.col", [&](Value* c) { emit_row_elements(b, e, sweep, at, c, 1, false); });
          });
          for (std::size_t r = 0; r < sweep.row_sums.size(); ++r)
            b.CreateStore(b.CreateLoad(b.getDoubleTy(), sweep.lane_sums[sweep.row_sums[r]]),
                          sweep.cell(stage, r, e.thread));
        });
        gpu_barrier(b);
        emit_if(b, active, "row.end", [&] {
          set_axis_position(b, row, in_matrix, row_in_matrix, nullptr);
          emit_if(b, b.CreateICmpEQ(lane, b.getInt64(0)), "row.sum", [&] {
            for (std::size_t r = 0; r < sweep.row_sums.size(); ++r) {
              llvm::AllocaInst* sum = sweep.lane_sums[sweep.row_sums[r]]; // lane 0's own sum, then the group's others
              emit_loop(b, b.getInt64(1), width, b.getInt64(1), "row.lane", [&](Value* l) {
                Value* other = b.CreateLoad(b.getDoubleTy(), sweep.cell(stage, r, b.CreateAdd(e.thread, l)));
                b.CreateStore(b.CreateFAdd(b.CreateLoad(b.getDoubleTy(), sum), other), sum);
              });
              b.CreateStore(
                  b.CreateLoad(b.getDoubleTy(), sum),
                  axis_array_address(b, carry_of_reduction(axis_reductions_[sweep.row_sums[r]]), SlotKind::Rows));
            }
          });
          emit_if(b, b.CreateICmpEQ(lane, last_lane), "row.store", [&] {
            for (std::size_t k = 0; k < graph_.stores.size(); ++k)
              if (sweep.pending[k]) {
                const Dtype storage = slot_dtype(graph_.stores[k].name);
                const int slot = index_in(plan_.abi.tensor_slots, graph_.stores[k].name);
                b.CreateAlignedStore(b.CreateLoad(sweep.pending[k]->getAllocatedType(), sweep.pending[k]),
                                     b.CreateGEP(scalar_type(storage), e.bases[static_cast<std::size_t>(slot)],
                                                 axis_index(SlotKind::Rows)),
                                     llvm::Align(dtype_size(storage)));
              }
          });
        });
      }
    });
    clear_axis_position();
  }
  struct RowSweep {
    std::vector<llvm::AllocaInst*> lane_sums; // per axis reduction: the lane's sum over its columns (row sums only)
    std::vector<std::size_t> row_sums;        // the axis reductions that are row sums
    std::vector<llvm::AllocaInst*> pending;   // per store: a rows slot's value at the lane's last column, or null
    std::function<Value*(int stage, std::size_t r, Value* thread)> cell;
  };
  // The row a row sweep's lane is on (emit_gpu_row_sweep); `last_row`: the item, when the row is its matrix's last.
  struct RowPosition {
    Value* row;
    Value* in_matrix;
    Value* row_in_matrix;
    const AxisItem* last_row;
  };
  // `lanes` elements of the row from column c: evaluated one at a time in column order, added to the lane's sums and
  // stored; with `vector_access` the tensor-shaped slots are read and written a vector at a time (128-bit accesses).
  void emit_row_elements(IRBuilder<>& b, const GpuEntry& e, const RowSweep& sweep, const RowPosition& at, Value* c,
                         int lanes, bool vector_access) {
    const int access = vector_access ? lanes : 1;
    Value* first = b.CreateAdd(b.CreateMul(at.row, axis_->n), c);
    std::vector<Value*> loaded(e.bases.size(), nullptr);
    std::vector<Value*> stored(graph_.stores.size(), nullptr);
    for (int lane = 0; lane < lanes; ++lane) {
      Value* j = lane == 0 ? first : b.CreateAdd(first, b.getInt64(lane));
      set_axis_position(b, at.row, at.in_matrix, at.row_in_matrix, lane == 0 ? c : b.CreateAdd(c, b.getInt64(lane)));
      const std::vector<Value*> values = evaluate_elements(
          b, e.values, [&](int slot) { return load_lane(b, e.bases, loaded, first, access, lane, slot, j); },
          element_type(), j);
      accumulate(b, values, e.thread_acc);
      add_axis_sums(b, values, sweep.lane_sums);
      store_gpu_element(b, e, values, j, at.last_row, sweep.pending, /*tensor_slots=*/!vector_access);
      if (vector_access)
        keep_lane(b, stored, values, lanes, lane);
    }
    store_lanes(b, e.bases, stored, first, lanes);
  }
  // Where the element being evaluated is (emit_gpu_axis_kernel's sweeps): its row in the tensor, its matrix, its row
  // in the matrix and its column in the row (null: not needed, or the sweep has none).
  void set_axis_position(IRBuilder<>& b, Value* row, Value* in_matrix, Value* row_in_matrix, Value* col_in_row) {
    axis_->row = row;
    axis_->row_in_matrix = row_in_matrix;
    axis_->col_in_row = col_in_row;
    axis_->col = col_in_row ? b.CreateAdd(b.CreateMul(in_matrix, axis_->n), col_in_row) : nullptr;
  }
  void clear_axis_position() { axis_->row = axis_->col = axis_->col_in_row = axis_->row_in_matrix = nullptr; }
  // Adds each axis reduction's element value to its running sum (the reductions with a sum in `sums`).
  void add_axis_sums(IRBuilder<>& b, const std::vector<Value*>& values, const std::vector<llvm::AllocaInst*>& sums) {
    for (std::size_t k = 0; k < sums.size(); ++k)
      if (sums[k]) {
        Value* v = values[static_cast<std::size_t>(graph_.node(axis_reductions_[k]).inputs[0])];
        b.CreateStore(b.CreateFAdd(b.CreateLoad(b.getDoubleTy(), sums[k]), b.CreateFPExt(v, b.getDoubleTy())), sums[k]);
      }
  }
  // The row sweep's stores of element j: its tensor slots (unless not `tensor_slots`); its columns slots when
  // `last_row` gives the item (a matrix's last row: to the slot, or to the column scratch when the item is a piece of
  // the matrix); its rows slots' values kept in `pending`, written after the stage's barrier.
  void store_gpu_element(IRBuilder<>& b, const GpuEntry& e, const std::vector<Value*>& values, Value* j,
                         const AxisItem* last_row, const std::vector<llvm::AllocaInst*>& pending,
                         bool tensor_slots = true) {
    int64_t columns_store = 0;
    for (std::size_t k = 0; k < graph_.stores.size(); ++k) {
      const Store& s = graph_.stores[k];
      if (s.kind != StoreKind::Tensor)
        continue;
      const int slot = index_in(plan_.abi.tensor_slots, s.name);
      const Dtype storage = tensor_slot_dtype(slot);
      Value* stored = to_storage(b, values[static_cast<std::size_t>(s.value)], storage);
      const SlotKind kind = graph_.slot(s.name)->kind;
      if (kind == SlotKind::Rows) {
        b.CreateStore(stored, pending[k]);
      } else if (kind == SlotKind::Tensor) {
        if (tensor_slots) // else the caller stores them a vector at a time
          b.CreateAlignedStore(stored, slot_address(b, e.bases, slot, j), llvm::Align(dtype_size(storage)));
      } else if (last_row) {
        Value* kept = b.CreateFPCast(values[static_cast<std::size_t>(s.value)], b.getDoubleTy());
        Value* at = column_pending(b, *last_row, columns_store++, axis_index(SlotKind::Cols));
        emit_if(b, last_row->split, "column.keep", [&] { b.CreateStore(kept, at); });
        emit_if(b, b.CreateNot(last_row->split), "column.store", [&] {
          b.CreateAlignedStore(stored, slot_address(b, e.bases, slot, j), llvm::Align(dtype_size(storage)));
        });
      }
    }
  }
};

} // namespace

void emit_gpu_axis_kernel(const KernelPlan& plan, llvm::Module& module, const std::string& symbol,
                          const GpuEmulationHooks* emulation) {
  GpuAxisKernelEmitter emitter(plan, module, emulation);
  emitter.emit_gpu_axis_kernel(symbol);
}

} // namespace optjit::emission
