"""What a time budget's plan trains, on paper: for shards already built (`detpipe data build`), at
each budget and each training rate at the fitted size, on a GPU and on a CPU, the default plan
(the fitted size, the epochs the budget buys up to the cap, and the augmentation strength those
epochs grow to: components/train/augment_settings.py) and what `budget_shape` chooses with
`--grow-input` (components/train/afforded_size.py). Arithmetic on the real boxes, no training:
the tables in docs/measurements.md ("On a GPU, on paper").

Usage:
    .venv/bin/python benchmarks/afforded_sizes.py --data SHARDS [--data SHARDS ...] \\
        --minutes 10,25 --gpu-rates 400,600,1560,3125 --cpu-rate 65
"""

from __future__ import annotations

import argparse

from beam.contract.label_map import num_class_slots, read_dataset_label_map
from components.detector.fitted_shape import shape_for_sample
from components.detector.holdout_size import held_out_share
from components.detector.holdout import TuningSplit
from components.detector.records import count_records, read_box_sample
from components.train.afforded_size import budget_shape
from components.train.augment_settings import run_strength
from components.train.config import TrainConfig
from components.train.time_budget import epochs_for_budget

SET_UP_SECONDS = 15.0  # what a run spends before its first step here (shape, rate, carve), about


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", action="append", required=True, help="a folder of shards (repeat for more)")
    parser.add_argument("--minutes", default="10,25")
    parser.add_argument("--gpu-rates", default="400,600,1560,3125", help="images/s at the fitted size on a GPU")
    parser.add_argument("--cpu-rate", type=float, default=65.0, help="images/s at the fitted size on this CPU")
    args = parser.parse_args()
    print("| shards (fit / carve) | budget | device | plan | fitted | " + " | ".join(
        f"{r} images/s" for r in args.gpu_rates.split(",")) + " |")
    for data in args.data:
        label_map = read_dataset_label_map(data)
        sample = read_box_sample(data, label_map=label_map)
        train = count_records(data, "train")
        config = TrainConfig(data_dir=data, output_dir="")
        carved = round(train * held_out_share(config.holdout, train))
        carve = TuningSplit("", config.holdout, config.seed, train - carved, carved)
        for on_gpu, rates in ((True, [float(r) for r in args.gpu_rates.split(",")]), (False, [args.cpu_rate])):
            fitted = shape_for_sample(sample, config.model_size, num_class_slots(label_map), "auto", on_gpu)
            for minutes in (float(m) for m in args.minutes.split(",")):
                default, grown = [], []
                for rate in rates:
                    length = epochs_for_budget(minutes * 60, SET_UP_SECONDS, rate, carve.fit)
                    strength, _ = run_strength(config.augment_strength, length.epochs)
                    default.append(f"{fitted.model.image_size} px, {length.epochs} epochs, strength {strength:.2f}")
                    budgeted = TrainConfig(data_dir=data, output_dir="", time_budget=f"{minutes:g}m", grow_input=True)
                    shape, planned = budget_shape(budgeted, sample, num_class_slots(label_map), fitted, length, carve,
                                                  False, 1, on_gpu)
                    grown.append(f"{shape.model.image_size} px, {planned.epochs} epochs")
                for plan, cells in (("default", default), ("--grow-input", grown)):
                    print(f"| {data} ({carve.fit} / {carve.held_out}) | {minutes:g} min | {'GPU' if on_gpu else 'CPU'} | "
                          f"{plan} | {fitted.model.image_size} px | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
