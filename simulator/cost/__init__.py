"""simulator/cost"""
