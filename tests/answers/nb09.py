"""Notebook 09's exercises, answered wrong on purpose (see tests/answers/__init__.py)."""
from answers import wrong

ANSWERS = {
    "checkpoint_layout": wrong(
        copier=("copies the file names the trees of section 1 print, the two ranks of that launch, whatever the world size", """
            def checkpoint_layout(stage: int, world_size: int, bf16: bool = False) -> set:
                prefix = "bf16_" if bf16 else ""
                optim = {f"{prefix}zero_pp_rank_0_mp_rank_00_optim_states.pt", f"{prefix}zero_pp_rank_1_mp_rank_00_optim_states.pt"}
                if stage == 0:
                    return {"mp_rank_00_model_states.pt"}
                if stage in (1, 2):
                    return {"mp_rank_00_model_states.pt"} | optim
                return {"zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_model_states.pt"} | optim
            """),
        misread=("thinks ZeRO-3 still writes one mp_rank_00_model_states.pt, the whole model gathered onto rank 0 as at "
                 "stages 0-2", """
            def checkpoint_layout(stage: int, world_size: int, bf16: bool = False) -> set:
                prefix = "bf16_" if bf16 else ""
                optim = {f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(world_size)}
                if stage == 0:
                    return {"mp_rank_00_model_states.pt"}
                return {"mp_rank_00_model_states.pt"} | optim
            """),
        secret=("zero_pp_rank_0_mp_rank_00_model_states.pt", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt")),
    "resume": wrong(
        copier=("copies the only load the course has shown (notebook 02's load_checkpoint with load_module_only=True), "
                "with the tag it is given, and returns the step A stored in client_state", """
            def resume(engine, folder: str, tag: str) -> int:
                _, client_state = engine.load_checkpoint(folder, tag=tag, load_module_only=True)
                return client_state["step"]
            """),
        misread=[("thinks a resume opens the newest checkpoint, the one `latest` names, as load_checkpoint does without a tag", """
            def resume(engine, folder: str, tag: str) -> int:
                _, client_state = engine.load_checkpoint(folder)
                return client_state["step"]
            """),
                 ("takes DeepSpeed's own step counter, restored by load_checkpoint, for the data position: with gradient "
                  "accumulation it counts optimizer steps, not the batches the loop read", """
            def resume(engine, folder: str, tag: str) -> int:
                engine.load_checkpoint(folder, tag=tag)
                return engine.global_steps
            """, "its loop started at another batch of the data stream")],
        run="from_solution", launches=True),
    "resume_point": wrong(
        copier=[("copies section 1's table: the tag from `latest`, the step from mp_rank_00_model_states.pt, which "
                 "holds client_state at stages 0-2", """
            def resume_point(folder) -> tuple:
                tag = (folder / "latest").read_text().strip()
                states = torch.load(folder / tag / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=True)
                return tag, states["step"]
            """),
                ("reads the step off the tag's name, global_step<N>, as the folders on the page are named", """
            def resume_point(folder) -> tuple:
                tag = (folder / "latest").read_text().strip()
                return tag, int(tag.removeprefix("global_step"))
            """)],
        misread=[("thinks DeepSpeed keeps client_state under a key of its own in the model-states file", """
            def resume_point(folder) -> tuple:
                tag = (folder / "latest").read_text().strip()
                states = sorted((folder / tag).glob("*model_states.pt"))[0]
                return tag, torch.load(states, map_location="cpu", weights_only=True)["client_state"]["step"]
            """),
                 ("takes the newest tag folder on disk (by modification time) for the checkpoint to resume, ignoring "
                  "`latest`, which a rolled-back run points to an older tag", """
            def resume_point(folder) -> tuple:
                tag = max((p for p in folder.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime).name
                states = sorted((folder / tag).glob("*model_states.pt"))[0]
                return tag, torch.load(states, map_location="cpu", weights_only=True)["step"]
            """, "does not return, as its first item, the tag `latest` names"),
                 ("takes the last tag folder by name, ignoring `latest`", """
            def resume_point(folder) -> tuple:
                tag = sorted(p.name for p in folder.glob("global_step*") if p.is_dir())[-1]
                states = sorted((folder / tag).glob("*model_states.pt"))[0]
                return tag, torch.load(states, map_location="cpu", weights_only=True)["step"]
            """, "rolled_back) does not return, as its first item, the tag `latest` names"),
                 ("reads DeepSpeed's own step counter, saved in the same file, for the step client_state stored: with "
                  "gradient accumulation it counts optimizer steps, not the batches the loop read", """
            def resume_point(folder) -> tuple:
                tag = (folder / "latest").read_text().strip()
                states = sorted((folder / tag).glob("*model_states.pt"))[0]
                return tag, torch.load(states, map_location="cpu", weights_only=True)["global_steps"]
            """, "names the tag `latest` points to, but not the step saved with that checkpoint in its client_state")],
        secret=("global_step4", "global_step8", "warmup-done")),
}
